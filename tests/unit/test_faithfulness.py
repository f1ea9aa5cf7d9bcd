"""Deletion and insertion curves: schedules, endpoints, areas, and a case where the map order must win."""

import pytest
import torch

from vitscope.explain.faithfulness import faithfulness_curves
from vitscope.functional.faithfulness import (
    curve_area,
    patch_order,
    patch_pixel_mask,
    perturbation_schedule,
    random_order,
)


def test_schedule_endpoints_and_counts():
    order = torch.tensor([[2, 0, 3, 1], [0, 1, 2, 3]])
    dele = perturbation_schedule(order, 4, "deletion")
    ins = perturbation_schedule(order, 4, "insertion")
    assert dele.shape == (2, 5, 4)
    assert dele[:, 0].all() and not dele[:, -1].any() and ins[:, -1].all() and not ins[:, 0].any()
    assert torch.equal(dele, ~ins)
    assert dele.sum(-1).tolist() == [[4, 3, 2, 1, 0]] * 2
    assert dele[0, 1].tolist() == [True, True, False, True]  # patch 2 goes first
    assert perturbation_schedule(order, 2, "deletion").sum(-1).tolist() == [[4, 2, 0]] * 2
    with pytest.raises(ValueError, match="mode"):
        perturbation_schedule(order, 4, "erase")
    with pytest.raises(ValueError, match="steps"):
        perturbation_schedule(order, 5)


def test_orders_masks_and_areas():
    maps = torch.tensor([[[0.1, 0.9], [0.5, 0.9]]])
    assert patch_order(maps).tolist() == [[1, 3, 2, 0]]  # ties: lower index first
    r = random_order(3, 10, torch.Generator().manual_seed(0))
    assert torch.equal(r.sort(-1).values, torch.arange(10).expand(3, 10))
    assert torch.equal(r, random_order(3, 10, torch.Generator().manual_seed(0)))
    m = patch_pixel_mask(torch.tensor([[True, False, False, True]]), (2, 2), (4, 4))
    assert m.shape == (1, 1, 4, 4) and m[0, 0, :2, :2].eq(1).all() and m[0, 0, :2, 2:].eq(0).all()
    assert curve_area(torch.tensor([[1.0, 0.0]])).item() == pytest.approx(0.5)
    assert curve_area(torch.full((2, 7), 0.3)).tolist() == pytest.approx([0.3, 0.3])
    curves = torch.rand(5, 9, generator=torch.Generator().manual_seed(1))
    area = curve_area(curves)
    assert (area >= curves.min(1).values - 1e-9).all() and (area <= curves.max(1).values + 1e-9).all()


class PatchIntensity:
    """A hand-made "model": the embedding is the vector of the 16 patch means of a 16 px image.

    The pair is (a, a): cos(e(masked a), e(a)) = sqrt(sum of kept v^2) / ||v||, so removing the patches
    with the largest v^2 first (the exact contributions) must beat any other order.
    """

    def pixels(self, x):
        return x

    def embed(self, x):
        return torch.nn.functional.avg_pool2d(x[:, :1], 4).flatten(1)


def test_the_true_contribution_order_beats_random_and_reversed():
    v = torch.tensor([5.0, 0.1, 0.2, 4.0, 0.1, 0.3, 0.1, 0.2, 3.0, 0.1, 0.1, 0.2, 0.1, 0.1, 0.2, 0.1])
    img = v.view(1, 1, 4, 4).repeat_interleave(4, 2).repeat_interleave(4, 3).expand(1, 3, 16, 16).clone()
    maps = {"true": (v ** 2).view(1, 4, 4), "reversed": -(v ** 2).view(1, 4, 4)}
    out = faithfulness_curves(PatchIntensity(), img, img, maps, random_seed=3)
    assert set(out.curves) == {"true", "reversed", "random"} and out.fractions.tolist()[::8] == [0.0, 0.5, 1.0]
    for order in out.curves:
        d, i = out.curves[order]["deletion"][0], out.curves[order]["insertion"][0]
        assert d[0] == pytest.approx(1.0) and d[-1] == pytest.approx(0.0)  # full image, then all baseline
        assert i[0] == pytest.approx(0.0) and i[-1] == pytest.approx(1.0)
    a = out.summary()
    assert a["true"]["deletion"] < a["random"]["deletion"] < a["reversed"]["deletion"]
    assert a["true"]["insertion"] > a["random"]["insertion"] > a["reversed"]["insertion"]
    assert all(0.0 <= x <= 1.0 for modes in a.values() for x in modes.values())


def test_curves_on_a_real_model_start_and_end_at_the_pair_score():
    from vitscope.explain import PairedSimilarity
    from vitscope.models.wrap import build_tiny_vit

    vit = build_tiny_vit("v", image_size=32, depth=2, embed_dim=32, num_heads=2, num_classes=8, global_pool="avg")
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    ps = PairedSimilarity(vit, projection="head", transpose=True)
    ex = ps.explain(x[:2], x[2:])
    out = faithfulness_curves(ps, x[:2], x[2:], {"paired": ex.map_a, "rollout": ex.rollout_a}, steps=4)
    for order in ("paired", "rollout", "random"):
        d, i = out.curves[order]["deletion"], out.curves[order]["insertion"]
        assert d.shape == (2, 5) and torch.allclose(d[:, 0], ex.score, atol=1e-5)
        assert torch.allclose(i[:, -1], ex.score, atol=1e-5)
        assert torch.allclose(d[:, -1], i[:, 0], atol=1e-6)  # both are the all-baseline image
    with pytest.raises(ValueError, match="at least one map"):
        faithfulness_curves(ps, x[:2], x[2:], {})


def test_areas_over_uneven_fractions():
    from vitscope.errors import VitscopeValueError
    from vitscope.functional.faithfulness import step_fractions

    assert step_fractions(4, 3).tolist() == [0.0, 0.25, 0.75, 1.0]
    assert step_fractions(8, 4).tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]  # steps dividing K: t / steps
    curve = torch.tensor([[4.0, 2.0, 2.0, 0.0]])
    assert curve_area(curve, step_fractions(4, 3)).item() == pytest.approx(3 * 0.25 + 2 * 0.5 + 1 * 0.25)
    even = torch.rand(3, 5, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(curve_area(even, step_fractions(8, 4)), curve_area(even))
    with pytest.raises(VitscopeValueError, match="increasing from 0 to 1"):
        curve_area(curve, torch.tensor([0.0, 0.5, 0.25, 1.0]))
