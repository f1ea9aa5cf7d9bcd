"""Deletion and insertion curves of attribution maps, on a score whose answer is known by hand."""

from __future__ import annotations

import pytest
import torch

from vitscope.attribution.faithfulness import faithfulness
from vitscope.errors import VitscopeValueError


def linear_score(weights: torch.Tensor):
    """score(x) = sum over pixels and channels of weights * x: each patch's share is exactly its weight sum."""
    return lambda x: (x * weights).flatten(1).sum(1)


def test_the_exact_map_deletes_fastest_and_the_curves_are_the_sums_left():
    # 2 images, 4 x 4 pixels, 2 x 2 patches of 2 x 2 pixels; pixels all 1, so a patch's score share = its weights
    weights = torch.zeros(2, 3, 4, 4)
    weights[0, :, :2, :2], weights[0, :, 2:, 2:] = 3.0, 1.0  # image 0: patch 0 holds 36, patch 3 holds 12
    weights[1, :, :2, 2:] = 2.0  # image 1: patch 1 holds 24
    pixels = torch.ones(2, 3, 4, 4)
    score = lambda x: linear_score(weights)(x)
    exact = torch.tensor([[[36.0, 0.0], [0.0, 12.0]], [[0.0, 24.0], [0.0, 0.0]]])
    out = faithfulness(score, pixels, exact, steps=4, fill="mean")
    torch.testing.assert_close(out.curves["map"]["deletion"], torch.tensor(
        [[48.0, 12.0, 0.0, 0.0, 0.0], [24.0, 0.0, 0.0, 0.0, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(out.curves["map"]["insertion"], torch.tensor(
        [[0.0, 36.0, 48.0, 48.0, 48.0], [0.0, 24.0, 24.0, 24.0, 24.0]], dtype=torch.float64))
    for baseline in ("random", "other_image"):  # no order deletes faster, or inserts faster, than the exact one
        assert bool((out.areas["map"]["deletion"] <= out.areas[baseline]["deletion"] + 1e-12).all())
        assert bool((out.areas["map"]["insertion"] >= out.areas[baseline]["insertion"] - 1e-12).all())
    assert out.summary()["map"]["deletion"] == pytest.approx(float(out.areas["map"]["deletion"].mean()))


def test_road_fills_a_constant_image_with_the_constant():
    """Removed patches of a constant image are imputed as the constant: the score stays until nothing is left to
    impute from (the last step: every patch removed is the mean colour, 0)."""
    pixels = torch.full((2, 3, 4, 4), 0.5)
    maps = torch.rand(2, 2, 2, generator=torch.Generator().manual_seed(0))
    out = faithfulness(lambda x: x.flatten(1).sum(1), pixels, maps, steps=2, fill="road", noise=0.0,
                       modes=("deletion",))
    torch.testing.assert_close(out.curves["map"]["deletion"], torch.tensor([[24.0, 24.0, 0.0]] * 2,
                                                                         dtype=torch.float64))
    with pytest.raises(VitscopeValueError, match="fill must be one of"):
        faithfulness(lambda x: x.sum(), pixels, maps, fill="blur")
    with pytest.raises(VitscopeValueError, match="does not tile"):
        faithfulness(lambda x: x.sum(), pixels, torch.rand(2, 3, 3))


def test_areas_are_over_the_share_of_patches_actually_removed():
    """4 patches in 3 steps remove 0, 1, 3 and 4 patches (round(t * 4 / 3)): the fractions are 0, 1/4, 3/4 and 1,
    and the trapezoids are taken over them (evenly spaced thirds gave 12 and 4 instead of 10.5 and 3)."""
    weights = torch.zeros(2, 3, 4, 4)
    weights[0, :, :2, :2], weights[0, :, 2:, 2:] = 3.0, 1.0
    weights[1, :, :2, 2:] = 2.0
    exact = torch.tensor([[[36.0, 0.0], [0.0, 12.0]], [[0.0, 24.0], [0.0, 0.0]]])
    out = faithfulness(linear_score(weights), torch.ones(2, 3, 4, 4), exact, steps=3, fill="mean")
    assert out.fractions.tolist() == [0.0, 0.25, 0.75, 1.0]
    torch.testing.assert_close(out.curves["map"]["deletion"], torch.tensor(
        [[48.0, 12.0, 0.0, 0.0], [24.0, 0.0, 0.0, 0.0]], dtype=torch.float64))
    # (48 + 12) / 2 * 1/4 + (12 + 0) / 2 * 1/2 = 10.5; 24 / 2 * 1/4 = 3
    torch.testing.assert_close(out.areas["map"]["deletion"], torch.tensor([10.5, 3.0], dtype=torch.float64))
    # insertion reveals 0, 36, 48, 48: 36 / 2 * 1/4 + (36 + 48) / 2 * 1/2 + 48 * 1/4 = 37.5
    assert float(out.areas["map"]["insertion"][0]) == pytest.approx(37.5)


def test_road_curves_of_an_image_do_not_depend_on_the_other_images_of_the_call():
    """Each image's ROAD noise comes from a generator of its own: image 0's map and random curves are the same in a
    call of three images and of two (one generator shared by the batch moved them by up to 0.02)."""
    gen = torch.Generator().manual_seed(3)
    pixels, maps = torch.randn(3, 3, 8, 8, generator=gen), torch.rand(3, 2, 2, generator=gen)
    weights = torch.randn(1, 3, 8, 8, generator=gen)
    score = lambda x: (x * weights).flatten(1).sum(1)
    three = faithfulness(score, pixels, maps, steps=4, fill="road", seed=5)
    two = faithfulness(score, pixels[:2], maps[:2], steps=4, fill="road", seed=5)
    for order in ("map", "random"):
        for mode in ("deletion", "insertion"):
            torch.testing.assert_close(three.curves[order][mode][:2], two.curves[order][mode], rtol=0, atol=1e-12)
    other_seed = faithfulness(score, pixels, maps, steps=4, fill="road", seed=6)
    assert not torch.equal(other_seed.curves["map"]["deletion"], three.curves["map"]["deletion"])
