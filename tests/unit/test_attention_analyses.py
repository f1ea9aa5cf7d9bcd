"""Attention-suite accumulators on hand-built patterns: maps, aligned maps, distance, entropy/focus, rollout,
the shared one-pass kernel, and the random baseline against the functional definitions."""

from __future__ import annotations

import math

import pytest
import torch

import vitscope.functional as F
from vitscope.analyses import (
    AlignedAttention,
    AttentionDistance,
    AttentionFocus,
    AttentionRollout,
    Batch,
    CLSAttentionMaps,
    SpatialAverageMaps,
    attention_suite,
)
from vitscope.analyses import batch as context
from vitscope.analyses.batch import SharedQuantities, union_plan
from vitscope.functional import attention_blocks as ap
from vitscope.functional.rollout import rollout
from vitscope.models.spec import ModelSpec


def make_spec(grid=(3, 3), prefix=("cls",), heads=2, blocks=1, patch=2) -> ModelSpec:
    return ModelSpec(name="hand-vit", family="tiny-vit", kind="transformer", num_blocks=blocks, num_heads=heads,
                     embed_dim=8, mlp_dim=16, patch_size=patch, grid=grid, num_prefix_tokens=len(prefix),
                     prefix_kinds=tuple(prefix), image_size=(grid[0] * patch, grid[1] * patch))


def make_batch(spec: ModelSpec, size: int, start: int = 0, masks=None) -> Batch:
    indices = list(range(start, start + size))
    targets = {"masks": masks} if masks is not None else {}
    return Batch(pixels=torch.zeros(size, 3, *spec.image_size), indices=indices, paths=[str(i) for i in indices],
                 spec=spec, grid=spec.grid, targets=targets)


def record_of(patterns: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    return {f"blocks.{i}.attn.pattern": p for i, p in enumerate(patterns)}


def softmax_pattern(b, h, n, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(3.0 * torch.randn(b, h, n, n, generator=g), dim=-1)


# ---------------------------------------------------------------- the shared kernel


@pytest.mark.parametrize("prefix", [(), ("cls",), ("cls", "reg", "reg")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_block_statistics_equal_the_functional_definitions(prefix, dtype):
    h, w, p = 3, 5, len(prefix)
    x = softmax_pattern(4, 3, p + h * w).to(dtype)
    x[0, 0, p + 1, p:] = 0.0  # a spatial query with no spatial mass
    if p:
        x[0, 0, p + 1, :p] = 1.0 / p
    x[1, 2, p + 2] = 0.0
    x[1, 2, p + 2, p:] = 1.0 / (h * w)  # a uniform spatial row: focus counts it as log K
    needs = ap.QUANTITIES - ({"cls"} if p == 0 else set())
    s = ap.block_statistics(x, (h, w), p, needs)
    tol = {"atol": 1e-5, "rtol": 0} if dtype == torch.float32 else {"atol": 1e-12, "rtol": 0}
    if p:
        torch.testing.assert_close(s.cls, F.cls_attention_map(x, (h, w), p).reshape(4, 3, -1), **tol)
    sam = F.spatial_average_map(x, (h, w), p).reshape(4, 3, -1)
    torch.testing.assert_close(s.colsum / s.colsum.sum(-1, keepdim=True), sam, **tol)
    aligned = F.aligned_attention(x, (h, w), p).sum(0).reshape(3, -1).double()
    torch.testing.assert_close(s.aligned, aligned, **tol)
    dist = ap.grid_tables((h, w)).cell_distance
    torch.testing.assert_close(s.aligned @ dist, F.attention_distance(x, (h, w), p).sum(0).double(), **tol)
    torch.testing.assert_close(s.entropy, F.attention_entropy(x), **tol)
    torch.testing.assert_close(s.focus, F.focus_index(x, (h, w), p), **tol)
    assert s.focus[1, 2] < math.log(h * w)  # the uniform row alone would give log K
    for mode in ap.FUSIONS:
        torch.testing.assert_close(s.fused[mode], {"mean": x.mean(1), "max": x.amax(1), "min": x.amin(1)}[mode])


def test_block_statistics_reject_a_wrong_grid():
    with pytest.raises(ValueError, match="grid 3x3 plus 1 prefix"):
        ap.block_statistics(softmax_pattern(1, 1, 11), (3, 3), 1, {"colsum"})
    with pytest.raises(ValueError, match="CLS"):
        ap.block_statistics(softmax_pattern(1, 1, 9), (3, 3), 0, {"cls"})


def test_suite_reduces_every_block_once_per_batch(monkeypatch):
    calls = []
    real = ap.block_statistics

    def counting(pattern, grid, num_prefix, needs, workspace=None, compiled=False):
        calls.append((id(pattern), frozenset(needs)))
        return real(pattern, grid, num_prefix, needs, workspace, compiled)

    monkeypatch.setattr(context, "block_statistics", counting)
    spec = make_spec(blocks=3)
    suite = attention_suite(spec, targets={"masks"})
    assert {a.name for a in suite} >= {"cls_attention_maps", "saliency_iou", "attention_rollout"}
    plan = union_plan([a.shared_quantities(spec) for a in suite])  # what the engine hands every batch
    masks = [torch.ones(1, *spec.image_size, dtype=torch.bool).numpy()] * 2
    for round_ in range(2):
        patterns = [softmax_pattern(2, 2, 10, seed=i + 3 * round_) for i in range(3)]
        record = record_of(patterns)
        batch = make_batch(spec, 2, start=2 * round_, masks=masks)
        batch.shared = SharedQuantities(record, plan)
        for a in suite:
            a.update(record, batch)
        on_data = [needs for key, needs in calls if key in {id(p) for p in patterns}]  # not the random baseline
        assert len(on_data) == 3, "one pass per block and batch, shared by every analysis of the suite"
        assert all(c == on_data[0] for c in on_data) and {"aligned", "entropy", "focus", "cls"} <= on_data[0]
        calls.clear()  # the next batch computes its own: nothing is kept from one batch to the next


def test_analyses_without_a_plan_still_share_what_overlaps(monkeypatch):
    calls = []
    real = ap.block_statistics
    monkeypatch.setattr(context, "block_statistics", lambda *a: calls.append(frozenset(a[3])) or real(*a))
    spec = make_spec()
    pattern = [softmax_pattern(2, 2, 10)]
    batch = make_batch(spec, 2)  # no engine: the batch creates its shared quantities on first request
    AlignedAttention().update(record_of(pattern), batch)
    AttentionDistance().update(record_of(pattern), batch)
    AttentionFocus().update(record_of(pattern), batch)  # asks for more: only the missing quantities are computed
    assert calls == [frozenset({"aligned"}), frozenset({"entropy", "focus"})]


# ---------------------------------------------------------------- maps


def two_image_pattern() -> torch.Tensor:
    """Grid 1 x 2, one CLS token, one head: rows are (CLS, spatial 0, spatial 1) over the same keys."""
    a = torch.tensor([[0.2, 0.5, 0.3], [0.1, 0.6, 0.3], [0.5, 0.25, 0.25]])
    b = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    return torch.stack([a, b]).unsqueeze(1)  # [2, 1, 3, 3]


def test_cls_and_spatial_average_maps_by_hand():
    spec = make_spec(grid=(1, 2), heads=1)
    record = record_of([two_image_pattern()])
    cls = CLSAttentionMaps(images=(1,))
    cls.update(record, make_batch(spec, 2))
    res = cls.compute()
    torch.testing.assert_close(res["mean_map"], torch.tensor([[[[0.75, 0.15]]]], dtype=torch.float64))
    assert res.meta["image_indices"] == [1] and res["images"].shape == (1, 2, 4, 3)
    torch.testing.assert_close(res["image_maps"][0], torch.tensor([[[[1.0, 0.0]]]], dtype=torch.float64))
    sam = SpatialAverageMaps(images=())
    sam.update(record, make_batch(spec, 2))
    # image a: spatial rows summed over the spatial keys = (0.85, 0.55) / 1.4; image b: (1, 1) / 2
    want = (torch.tensor([0.85, 0.55]) / 1.4 + torch.tensor([0.5, 0.5])) / 2
    torch.testing.assert_close(sam.compute()["mean_map"], want.double().view(1, 1, 1, 2))
    assert "image_maps" not in sam.compute().tensors


def test_cls_maps_need_a_cls_token():
    siglip = make_spec(prefix=())
    assert not CLSAttentionMaps().supports(siglip)
    assert "CLS token" in CLSAttentionMaps().why_unsupported(siglip)
    assert SpatialAverageMaps().supports(siglip)
    assert "cls_attention_maps" not in {a.name for a in attention_suite(siglip)}


def test_maps_refuse_a_second_model():
    acc = SpatialAverageMaps()
    acc.update(record_of([softmax_pattern(1, 2, 10)]), make_batch(make_spec(), 1))
    with pytest.raises(ValueError, match="one model per analysis"):
        acc.update(record_of([softmax_pattern(1, 3, 10)]), make_batch(make_spec(heads=3), 1))


# ---------------------------------------------------------------- aligned maps and distance


def neighbour_pattern(prefix_mass: float = 0.0) -> torch.Tensor:
    """3 x 3 grid, CLS first; head 0: each query attends to its right neighbour (last column: itself);
    head 1: each query attends to itself. ``prefix_mass`` of every spatial row goes to the CLS token."""
    h = w = 3
    x = torch.zeros(2, 10, 10)
    x[:, 0, :] = 0.1  # CLS row: uniform
    for r in range(h):
        for c in range(w):
            q = 1 + r * w + c
            x[0, q, 1 + r * w + min(c + 1, w - 1)] = 1.0 - prefix_mass
            x[1, q, q] = 1.0 - prefix_mass
            x[:, q, 0] = prefix_mass
    return x.unsqueeze(0)


@pytest.mark.parametrize("prefix_mass", [0.0, 0.5])
def test_offset_and_strict_heads_by_hand(prefix_mass):
    spec = make_spec()
    record = record_of([neighbour_pattern(prefix_mass)])
    acc = AlignedAttention()
    acc.update(record, make_batch(spec, 1))
    res = acc.compute()
    aaam = res["aaam"][0]
    assert aaam.shape == (2, 5, 5)
    assert math.isclose(float(aaam[0, 2, 3]), 6 / 9) and math.isclose(float(aaam[0, 2, 2]), 3 / 9)
    assert math.isclose(float(aaam[1, 2, 2]), 1.0)
    assert res.meta["head_types"] == [["offset_local", "strict_local"]]
    assert res.meta["offset_heads"] == [[0, 0, 0, 1]]
    # centre of mass: column coordinate of cell (2, 3) is 2 * 3 / 4 - 1 = 0.5, carrying 6/9 of the mass
    torch.testing.assert_close(res["offset"][0], torch.tensor([[0.0, 1 / 3], [0.0, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(res["offset_norm"][0], torch.tensor([1 / 3, 0.0], dtype=torch.float64))
    dist = AttentionDistance()
    dist.update(record, make_batch(spec, 1))
    # a right neighbour is 1 / (w - 1) = 0.5 away; 6 of 9 queries have one
    torch.testing.assert_close(dist.compute()["distance"], torch.tensor([[1 / 3, 0.0]], dtype=torch.float64))


def test_aligned_tables_list_the_offset_heads(tmp_path):
    acc = AlignedAttention()
    acc.update(record_of([neighbour_pattern()]), make_batch(make_spec(), 1))
    paths = acc.compute().save(tmp_path)
    names = {p.name for p in paths}
    assert {"aligned_attention_heads.csv", "aligned_attention_offset_heads.csv"} <= names
    offset = (tmp_path / "aligned_attention_offset_heads.csv").read_text().splitlines()
    assert len(offset) == 2 and offset[1].startswith("0,0,offset_local,0,1,")


def test_distance_random_baseline_is_the_functional_one_on_seeded_random_attention():
    spec = make_spec(grid=(2, 3), blocks=2)
    acc = AttentionDistance(seed=7, random_samples=3)
    acc.update(record_of([softmax_pattern(2, 2, 7, seed=i) for i in range(2)]), make_batch(spec, 2))
    got = acc.compute()["random_distance"]
    gen = torch.Generator().manual_seed(7)
    want = torch.stack([F.attention_distance(F.random_attention((3, 2, 7, 7), gen, dtype=torch.float64), (2, 3), 1)
                        .mean(0) for _ in range(2)])
    torch.testing.assert_close(got, want)
    again = AttentionDistance(seed=7, random_samples=3)
    again.update(record_of([softmax_pattern(1, 2, 7, seed=5) for _ in range(2)]), make_batch(spec, 1))
    torch.testing.assert_close(again.compute()["random_distance"], got)  # one baseline per seed, not per data
    other = AttentionDistance(seed=8, random_samples=3)
    other.update(record_of([softmax_pattern(1, 2, 7) for _ in range(2)]), make_batch(spec, 1))
    assert not torch.allclose(other.compute()["random_distance"], got)


# ---------------------------------------------------------------- entropy and focus


def test_entropy_and_focus_of_uniform_and_one_hot_heads():
    n, k = 10, 9
    x = torch.zeros(1, 2, n, n)
    x[0, 0] = 1.0 / n  # uniform over every key
    x[0, 1] = torch.eye(n)  # every token attends to itself only
    acc = AttentionFocus()
    acc.update(record_of([x]), make_batch(make_spec(), 1))
    res = acc.compute()
    torch.testing.assert_close(res["entropy"], torch.tensor([[math.log(n), 0.0]], dtype=torch.float64))
    torch.testing.assert_close(res["focus"], torch.tensor([[math.log(k), 0.0]], dtype=torch.float64))
    torch.testing.assert_close(res["focus_normalised"], torch.tensor([[1.0, 0.0]], dtype=torch.float64))
    assert 0.9 < float(res["random_entropy_normalised"].mean()) < 1.0  # random attention is nearly uniform


# ---------------------------------------------------------------- rollout


def test_rollout_of_uniform_attention_has_a_closed_form():
    spec = make_spec(blocks=3)
    n, k, layers = 10, 9, 3
    x = torch.full((2, 2, n, n), 1.0 / n)
    acc = AttentionRollout(images=(0,))
    acc.update(record_of([x] * layers), make_batch(spec, 2))
    res = acc.compute()
    # A_hat = (U + I) / 2 with U the uniform matrix (U @ U = U): A_hat^L = I / 2^L + (1 - 1 / 2^L) U
    want = torch.eye(n, dtype=torch.float64) / 2**layers + (1 - 1 / 2**layers) / n
    torch.testing.assert_close(res["mean_rollout"], want)
    torch.testing.assert_close(res["mean_map"], torch.full((3, 3), 1 / k, dtype=torch.float64))
    assert res.meta["map_source"] == "cls" and res["image_maps"].shape == (1, 3, 3)


@pytest.mark.parametrize(("fusion", "discard", "exclude"), [("mean", 0.0, False), ("max", 0.3, False),
                                                            ("min", 0.0, True)])
def test_rollout_equals_the_functional_rollout(fusion, discard, exclude):
    spec = make_spec(grid=(2, 3), blocks=3)
    patterns = [softmax_pattern(3, 2, 7, seed=i) for i in range(3)]
    acc = AttentionRollout(head_fusion=fusion, discard_ratio=discard, exclude_prefix=exclude, images=(2,))
    acc.update(record_of(patterns), make_batch(spec, 3))
    res = acc.compute()
    r = rollout(patterns, fusion, discard, num_prefix=1 if exclude else None)
    torch.testing.assert_close(res["mean_rollout"], r.mean(0).double(), atol=1e-6, rtol=0)
    if exclude:  # no CLS row in the rolled-out spatial attention: spatial-average map of R
        m = r[2].sum(0)
    else:
        m = r[2, 0, 1:]
    torch.testing.assert_close(res["image_maps"][0].reshape(-1), (m / m.sum()).double(), atol=1e-6, rtol=0)


def test_rollout_without_cls_uses_the_spatial_average_map():
    spec = make_spec(grid=(2, 2), prefix=(), blocks=2)
    patterns = [softmax_pattern(1, 2, 4, seed=i) for i in range(2)]
    acc = AttentionRollout()
    acc.update(record_of(patterns), make_batch(spec, 1))
    res = acc.compute()
    r = rollout(patterns)[0]
    assert res.meta["map_source"] == "spatial_average"
    torch.testing.assert_close(res["mean_map"].reshape(-1), (r.sum(0) / r.sum()).double(), atol=1e-6, rtol=0)


def test_figures_put_several_models_on_one_plot(tmp_path):
    from vitscope.viz.attention_figures import distance_figure, saliency_figure

    d = {"sup": torch.rand(4, 3), "distill": torch.rand(4, 3)}
    paths = distance_figure(d, tmp_path / "distance", random=torch.rand(4, 3))
    models = {"sup": {"cls": torch.rand(4), "spatial": torch.rand(4)}, "distill": {"cls": torch.rand(4)}}
    paths += saliency_figure(models, {"cls": torch.rand(4)}, tmp_path / "saliency")
    assert [p.suffix for p in paths] == [".png", ".svg"] * 2
    assert all(p.stat().st_size > 0 for p in paths)
    svg = (tmp_path / "distance.svg").read_text()
    assert "sup" in svg and "distill" in svg and "random attention" in svg  # one legend entry per model


def test_work_buffers_serve_inference_mode_and_normal_mode_alike():
    workspace = ap.Workspace()
    x = softmax_pattern(2, 2, 10)
    with torch.inference_mode():
        inside = ap.block_statistics(x, (3, 3), 1, {"aligned", "entropy", "focus"}, workspace)
    outside = ap.block_statistics(x, (3, 3), 1, {"aligned", "entropy", "focus"}, workspace)
    fresh = ap.block_statistics(x, (3, 3), 1, {"aligned", "entropy", "focus"})  # no workspace: temporaries
    torch.testing.assert_close(fresh.focus, inside.focus)
    workspace.release()
    torch.testing.assert_close(outside.focus, inside.focus)
    torch.testing.assert_close(outside.aligned, inside.aligned)
