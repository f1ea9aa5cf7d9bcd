"""Hand-computed cases and properties for vitscope.functional.attention and .rollout (docs/methods.md, Attention)."""

from __future__ import annotations

import math

import pytest
import torch

from vitscope.functional import attention_stats
from vitscope.functional.attention import (
    attention_entropy,
    cls_attention_map,
    focus_index,
    mass_mask,
    random_attention,
    spatial_attention,
    spatial_average_map,
)
from vitscope.functional.attention_geometry import (
    HEAD_TYPES,
    aligned_attention,
    aligned_offset,
    attention_distance,
    local_head_type,
)
from vitscope.functional.rollout import discard_smallest, fuse_heads, rollout

F64 = torch.float64


# ---------------------------------------------------------------- builders


def _pattern_from_spatial(spatial: torch.Tensor, num_prefix: int, prefix_mass: float = 0.0) -> torch.Tensor:
    """Embed a spatial pattern [..., K, K] into [..., N, N]: prefix rows uniform, spatial rows scaled so that
    ``prefix_mass`` of every spatial row goes to the prefix keys (spread evenly)."""
    k = spatial.shape[-1]
    n = k + num_prefix
    out = torch.zeros(*spatial.shape[:-2], n, n, dtype=spatial.dtype)
    out[..., :num_prefix, :] = 1.0 / n
    out[..., num_prefix:, num_prefix:] = spatial * (1.0 - prefix_mass)
    if num_prefix:
        out[..., num_prefix:, :num_prefix] = prefix_mass / num_prefix
    return out


def _random_pattern(b: int, h: int, n: int, seed: int, dtype: torch.dtype = F64, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(scale * torch.randn(b, h, n, n, generator=g, dtype=dtype), dim=-1)


def _loop_distance(pattern: torch.Tensor, grid: tuple[int, int], p: int) -> torch.Tensor:
    h, w = grid
    b, nh = pattern.shape[:2]
    out = torch.zeros(b, nh, dtype=F64)
    for bi in range(b):
        for hi in range(nh):
            total = 0.0
            for q in range(h * w):
                row = pattern[bi, hi, p + q, p:].double()
                s = float(row.sum())
                if s == 0:
                    continue
                rq, cq = divmod(q, w)
                for k in range(h * w):
                    rk, ck = divmod(k, w)
                    dx = (ck - cq) / (w - 1) if w > 1 else 0.0
                    dy = (rk - rq) / (h - 1) if h > 1 else 0.0
                    total += float(row[k]) / s * math.hypot(dx, dy)
            out[bi, hi] = total / (h * w)
    return out


def _loop_aligned(pattern: torch.Tensor, grid: tuple[int, int], p: int) -> torch.Tensor:
    """The 002 code's AvgAlignedAttentionOnToken for one batch, generalised to h x w."""
    h, w = grid
    b, nh = pattern.shape[:2]
    att = pattern[:, :, p:, p:].double()
    s = att.sum(-1, keepdim=True)
    att = att / torch.where(s == 0, torch.ones_like(s), s)
    att = att.reshape(b, nh, h * w, h, w)
    canvas = torch.zeros(b, nh, 2 * h - 1, 2 * w - 1, dtype=F64)
    for q in range(h * w):
        i, j = divmod(q, w)
        canvas[:, :, h - 1 - i : 2 * h - 1 - i, w - 1 - j : 2 * w - 1 - j] += att[:, :, q]
    return canvas / (h * w)


def _canvas(side: int, cells: dict[tuple[int, int], float]) -> torch.Tensor:
    m = torch.zeros(side, side, dtype=F64)
    for (r, c), v in cells.items():
        m[r, c] = v
    return m


# ---------------------------------------------------------------- spatial attention and maps


def test_attention_entropy_is_re_exported() -> None:
    assert attention_entropy is attention_stats.attention_entropy


@pytest.mark.parametrize("num_prefix", [0, 1, 3])
def test_spatial_attention_drops_prefix_and_renormalises(num_prefix: int) -> None:
    p = _random_pattern(2, 3, 6 + num_prefix, seed=1)
    s = spatial_attention(p, num_prefix)
    assert s.shape == (2, 3, 6, 6)
    torch.testing.assert_close(s.sum(-1), torch.ones(2, 3, 6, dtype=F64))
    raw = p[..., num_prefix:, num_prefix:]
    torch.testing.assert_close(s, raw / raw.sum(-1, keepdim=True))


def test_spatial_attention_zero_row_stays_zero() -> None:
    p = torch.zeros(1, 1, 3, 3)
    p[0, 0, :, 0] = 1.0  # every query attends only to CLS
    p[0, 0, 2] = torch.tensor([0.5, 0.25, 0.25])
    s = spatial_attention(p, 1)
    assert torch.equal(s[0, 0, 0], torch.zeros(2))
    torch.testing.assert_close(s[0, 0, 1], torch.tensor([0.5, 0.5]))
    assert not torch.isnan(s).any()


def test_cls_attention_map_non_square_grid_with_registers() -> None:
    # 2 prefix tokens (CLS + register), grid 2 x 3.
    row0 = torch.tensor([0.1, 0.3, 0.05, 0.1, 0.15, 0.1, 0.1, 0.1])
    p = torch.zeros(1, 1, 8, 8)
    p[0, 0, 0] = row0
    m = cls_attention_map(p, (2, 3), num_prefix=2)
    assert m.shape == (1, 1, 2, 3)
    torch.testing.assert_close(m[0, 0], torch.tensor([[0.05, 0.1, 0.15], [0.1, 0.1, 0.1]]))
    r = cls_attention_map(p, (2, 3), num_prefix=2, renormalise=True)
    torch.testing.assert_close(r[0, 0], torch.tensor([[0.05, 0.1, 0.15], [0.1, 0.1, 0.1]]) / 0.6)
    with pytest.raises(ValueError, match="CLS"):
        cls_attention_map(p, (2, 4), num_prefix=0)
    with pytest.raises(ValueError, match="grid"):
        cls_attention_map(p, (3, 3), num_prefix=2)


def test_spatial_average_map_sums_raw_rows() -> None:
    # N = 3, one CLS token, grid 1 x 2. The spatial rows give the CLS token unequal mass.
    p = torch.tensor([[0.2, 0.3, 0.5], [0.5, 0.4, 0.1], [0.0, 0.2, 0.8]], dtype=F64).reshape(1, 1, 3, 3)
    m = spatial_average_map(p, (1, 2), num_prefix=1)
    # raw sums: key 1 = 0.4 + 0.2 = 0.6, key 2 = 0.1 + 0.8 = 0.9 -> [0.4, 0.6]
    torch.testing.assert_close(m, torch.tensor([[[[0.4, 0.6]]]], dtype=F64))
    # per-row renormalisation would have given [0.5, 0.5]: make sure that is NOT what we compute
    assert not torch.allclose(m, torch.full_like(m, 0.5))
    q = _random_pattern(2, 3, 7, seed=2)
    mm = spatial_average_map(q, (2, 3), num_prefix=1)
    assert mm.shape == (2, 3, 2, 3)
    torch.testing.assert_close(mm.sum((-2, -1)), torch.ones(2, 3, dtype=F64))


def test_spatial_average_map_all_mass_on_prefix_stays_zero() -> None:
    p = torch.zeros(1, 1, 3, 3)
    p[..., 0] = 1.0
    assert torch.equal(spatial_average_map(p, (1, 2), 1), torch.zeros(1, 1, 1, 2))


def test_bad_inputs_explain_themselves() -> None:
    p = torch.full((1, 1, 5, 5), 0.2)
    with pytest.raises(ValueError, match="grid 2x3"):
        attention_distance(p, (2, 3), 1)
    with pytest.raises(ValueError, match="num_prefix"):
        spatial_attention(p, 5)
    with pytest.raises(ValueError, match="B, H, N, N"):
        spatial_attention(torch.ones(2, 3), 0)
    with pytest.raises(ValueError, match="grid"):
        aligned_attention(p, (0, 4), 1)


# ---------------------------------------------------------------- attention distance


def test_distance_one_hot_on_non_square_grid() -> None:
    # grid 2 x 3: token (r, c) at (c / 2, r / 1). Every spatial query attends only to (1, 2) = (1, 1).
    k = 6
    spatial = torch.zeros(k, k, dtype=F64)
    spatial[:, 5] = 1.0
    p = _pattern_from_spatial(spatial, num_prefix=1, prefix_mass=0.5)[None, None]  # half the mass on CLS
    expected = (math.sqrt(2) + math.sqrt(1.25) + 1 + 1 + 0.5 + 0) / 6
    assert attention_distance(p, (2, 3), 1).item() == pytest.approx(expected, rel=1e-12)
    # transposed grid 3 x 2: tokens at (c / 1, r / 2), target (2, 1) = (1, 1)
    # queries: (0,0)=(0,0) sqrt2, (0,1)=(1,0) 1, (1,0)=(0,.5) sqrt(1.25), (1,1)=(1,.5) .5, (2,0)=(0,1) 1, (2,1) 0
    assert attention_distance(p, (3, 2), 1).item() == pytest.approx(expected, rel=1e-12)


def test_distance_uniform_two_by_two() -> None:
    p = torch.full((1, 2, 4, 4), 0.25, dtype=F64)  # no prefix (SigLIP-like)
    torch.testing.assert_close(attention_distance(p, (2, 2), 0), torch.full((1, 2), (2 + math.sqrt(2)) / 4, dtype=F64))


def test_distance_axis_of_length_one() -> None:
    p = torch.full((1, 1, 3, 3), 1 / 3, dtype=F64)  # grid 1 x 3: x = 0, 0.5, 1
    assert attention_distance(p, (1, 3), 0).item() == pytest.approx(4 / 9, rel=1e-12)
    assert attention_distance(p, (3, 1), 0).item() == pytest.approx(4 / 9, rel=1e-12)
    one = torch.ones(1, 1, 2, 2)  # grid 1 x 1 after a CLS token
    assert attention_distance(one, (1, 1), 1).item() == 0.0


def test_distance_self_attention_is_zero() -> None:
    p = _pattern_from_spatial(torch.eye(12, dtype=F64), num_prefix=2)[None, None]
    assert attention_distance(p, (3, 4), 2).item() == 0.0


@pytest.mark.parametrize(("grid", "num_prefix"), [((2, 3), 1), ((3, 2), 0), ((1, 4), 2), ((4, 4), 5), ((14, 14), 1)])
def test_distance_and_aligned_match_loop_reference(grid: tuple[int, int], num_prefix: int) -> None:
    k = grid[0] * grid[1]
    b, nh = (1, 2) if k > 100 else (2, 3)
    p = _random_pattern(b, nh, k + num_prefix, seed=k + num_prefix)
    if num_prefix:
        p[0, 0, num_prefix] = 0.0
        p[0, 0, num_prefix, 0] = 1.0  # one spatial query with all its mass on a prefix token
    torch.testing.assert_close(attention_distance(p, grid, num_prefix), _loop_distance(p, grid, num_prefix))
    torch.testing.assert_close(aligned_attention(p, grid, num_prefix), _loop_aligned(p, grid, num_prefix))


# ---------------------------------------------------------------- aligned maps and offsets


def test_aligned_self_attention_is_one_at_centre() -> None:
    p = _pattern_from_spatial(torch.eye(6, dtype=F64), num_prefix=1, prefix_mass=0.3)[None, None]
    a = aligned_attention(p, (2, 3), 1)
    assert a.shape == (1, 1, 3, 5)
    expected = torch.zeros(3, 5, dtype=F64)
    expected[1, 2] = 1.0
    torch.testing.assert_close(a[0, 0], expected)


def test_aligned_right_neighbour_with_boundary_queries() -> None:
    # grid 2 x 3; query (i, j) attends (i, j + 1); the last column (2 queries) attends itself.
    h, w = 2, 3
    spatial = torch.zeros(6, 6, dtype=F64)
    for q in range(6):
        i, j = divmod(q, w)
        spatial[q, q + 1 if j + 1 < w else q] = 1.0
    a = aligned_attention(spatial[None, None], (h, w), 0)[0, 0]
    expected = torch.zeros(3, 5, dtype=F64)
    expected[1, 3] = 4 / 6  # (h-1, w): four interior queries
    expected[1, 2] = 2 / 6  # centre: the two boundary queries
    torch.testing.assert_close(a, expected)
    # offset: row coordinate of row 1 is 0; column coordinates 2*j/4 - 1 -> j=3: 0.5, j=2: 0
    vec, norm = aligned_offset(a)
    torch.testing.assert_close(vec, torch.tensor([0.0, (2 / 3) * 0.5], dtype=F64))
    assert norm.item() == pytest.approx(1 / 3, rel=1e-12)


def test_aligned_attention_sums_to_one_and_keeps_dtype() -> None:
    p = _random_pattern(2, 3, 7, seed=3, dtype=torch.float32)
    a = aligned_attention(p, (3, 2), 1)
    assert a.shape == (2, 3, 5, 3) and a.dtype == torch.float32
    torch.testing.assert_close(a.sum((-2, -1)), torch.ones(2, 3))
    assert aligned_attention(p.half(), (3, 2), 1).dtype == torch.float32
    assert aligned_attention(p.double(), (3, 2), 1).dtype == F64


def test_aligned_offset_by_hand() -> None:
    # 3 x 3 canvas (h = w = 2): coordinates -1, 0, 1 on both axes.
    m = _canvas(3, {(0, 1): 3.0, (1, 1): 1.0})  # not normalised: 0.75 above the centre
    vec, norm = aligned_offset(m)
    torch.testing.assert_close(vec, torch.tensor([-0.75, 0.0], dtype=F64))  # (dy, dx)
    assert norm.item() == pytest.approx(0.75)
    m2 = _canvas(3, {(2, 2): 1.0})  # bottom-right corner
    torch.testing.assert_close(aligned_offset(m2)[0], torch.tensor([1.0, 1.0], dtype=F64))
    # axis of length 1 (h = 1): the row coordinate is 0
    m3 = torch.tensor([[0.0, 0.0, 0.0, 0.0, 2.0]], dtype=F64)
    vec3, norm3 = aligned_offset(m3)
    torch.testing.assert_close(vec3, torch.tensor([0.0, 1.0], dtype=F64))
    # zero map stays zero, batched shapes
    vec4, norm4 = aligned_offset(torch.zeros(4, 2, 3, 5))
    assert vec4.shape == (4, 2, 2) and norm4.shape == (4, 2)
    assert torch.equal(norm4, torch.zeros(4, 2))
    with pytest.raises(ValueError, match="odd"):
        aligned_offset(torch.ones(4, 5))


# ---------------------------------------------------------------- local-head taxonomy (9 x 9 canvas, centre (4, 4))


def _strict() -> torch.Tensor:
    return _canvas(9, {(4, 4): 0.5, (0, 0): 0.25, (8, 8): 0.25})  # exactly 0.5 on the centre counts


def _offset() -> torch.Tensor:
    return _canvas(9, {(4, 4): 0.2, (4, 5): 0.45, (0, 0): 0.35})  # peak one to the right, 0.45 >= 0.3


def _soft() -> torch.Tensor:
    cells = {(r, c): 0.1 for r in range(3, 6) for c in range(3, 6)}  # ties with the centre: peak = centre
    cells.update({(0, 0): 0.025, (0, 8): 0.025, (8, 0): 0.025, (8, 8): 0.025})
    return _canvas(9, cells)


def _axial_row() -> torch.Tensor:
    cells = {(4, c): 0.8 / 9 for c in range(9)}  # window mass 5 * 0.8 / 9 = 0.44 < 0.5
    cells[(0, 0)] = 0.2  # the peak, 4 cells away: not an offset head
    return _canvas(9, cells)


def _global() -> torch.Tensor:
    return torch.full((9, 9), 1 / 81, dtype=F64)


def test_taxonomy_each_class_by_hand() -> None:
    assert local_head_type(_strict()) == ("strict_local", (0, 0))
    assert local_head_type(_offset()) == ("offset_local", (0, 1))
    assert local_head_type(_soft()) == ("soft_local", (0, 0))
    assert local_head_type(_axial_row()) == ("axial", (-4, -4))
    assert local_head_type(_axial_row().T.contiguous()) == ("axial", (-4, -4))
    assert local_head_type(_global()) == ("global", (0, 0))
    assert local_head_type(torch.zeros(9, 9)) == ("global", (0, 0))
    assert HEAD_TYPES == ("strict_local", "offset_local", "soft_local", "axial", "global")


def test_taxonomy_order_and_thresholds() -> None:
    # strict AND soft -> strict (first match)
    assert local_head_type(_canvas(9, {(4, 4): 0.6, (4, 5): 0.4}))[0] == "strict_local"
    # offset AND soft (all mass within the window) -> offset
    assert local_head_type(_canvas(9, {(4, 4): 0.2, (3, 5): 0.35, (5, 5): 0.2, (5, 4): 0.25}))[0] == "offset_local"
    # just below the thresholds
    assert local_head_type(_canvas(9, {(4, 4): 0.49, (0, 0): 0.51}))[0] == "global"
    below_offset = _canvas(9, {(4, 4): 0.2, (2, 6): 0.29, (0, 0): 0.26, (8, 8): 0.25})  # peak 0.29 < 0.3
    assert local_head_type(below_offset) == ("global", (-2, 2))
    assert local_head_type(below_offset, offset=0.29) == ("offset_local", (-2, 2))
    # peak offset at Chebyshev distance 3 is not an offset head (falls through to global)
    assert local_head_type(_canvas(9, {(4, 4): 0.2, (4, 7): 0.45, (0, 0): 0.35})) == ("global", (0, 3))
    # thresholds are arguments
    assert local_head_type(_offset(), offset=0.5)[0] == "soft_local"  # window mass 0.65
    assert local_head_type(_canvas(9, {(4, 4): 0.2, (4, 7): 0.45, (0, 0): 0.35}), radius=3)[0] == "offset_local"
    assert local_head_type(_strict(), strict=0.6)[0] == "soft_local"  # 0.5 still within the window
    assert local_head_type(_axial_row(), axial=0.9)[0] == "global"
    # normalisation: the scale of the map does not matter
    assert local_head_type(7.0 * _offset()) == ("offset_local", (0, 1))


def test_taxonomy_batched() -> None:
    maps = torch.stack([_strict(), _offset(), _soft(), _axial_row(), _global()])
    labels, peaks = local_head_type(maps)
    assert labels == ["strict_local", "offset_local", "soft_local", "axial", "global"]
    assert peaks.dtype == torch.int64
    assert peaks.tolist() == [[0, 0], [0, 1], [0, 0], [-4, -4], [0, 0]]
    # equal peaks away from the centre: the first in row-major order is the peak
    assert local_head_type(_canvas(9, {(4, 4): 0.2, (4, 5): 0.4, (0, 0): 0.4})) == ("soft_local", (-4, -4))
    nested, peaks2 = local_head_type(maps.reshape(1, 5, 9, 9).expand(2, 5, 9, 9))
    assert nested == [labels, labels]
    assert peaks2.shape == (2, 5, 2)


def test_taxonomy_of_an_aligned_right_neighbour_head() -> None:
    h = w = 5
    spatial = torch.zeros(25, 25, dtype=F64)
    for q in range(25):
        spatial[q, q + 1 if q % w + 1 < w else q] = 1.0
    a = aligned_attention(spatial[None, None], (h, w), 0)[0, 0]  # 0.8 at (4, 5), 0.2 at the centre
    assert local_head_type(a) == ("offset_local", (0, 1))


# ---------------------------------------------------------------- mass mask


def _dino_mask(m: torch.Tensor, mass: float) -> torch.Tensor:
    """DINO's rule: sort ascending, keep where the cumulative sum exceeds 1 - mass. Ties: higher index first
    (discarded first), i.e. the same deterministic order as vitscope."""
    flat = m.reshape(-1).double()
    flat = flat / flat.sum()
    k = flat.numel()
    vals, idx = torch.sort(flat.flip(0), stable=True)
    idx = k - 1 - idx
    keep_sorted = torch.cumsum(vals, 0) > 1 - mass
    keep = torch.zeros(k, dtype=torch.bool)
    keep[idx] = keep_sorted
    return keep.reshape(m.shape)


def test_mass_mask_by_hand() -> None:
    m = torch.tensor([[0.5, 0.3], [0.1, 0.1]])
    assert mass_mask(m, 0.6).tolist() == [[True, True], [False, False]]
    assert mass_mask(10 * m, 0.6).tolist() == [[True, True], [False, False]]  # renormalised
    dyadic = torch.tensor([[0.5, 0.25], [0.125, 0.125]], dtype=F64)  # exact in binary: exact boundaries
    assert mass_mask(dyadic, 0.5).tolist() == [[True, False], [False, False]]  # 0.5 reaches 0.5
    assert mass_mask(dyadic, 0.75).tolist() == [[True, True], [False, False]]
    assert mass_mask(m, 0.45).tolist() == [[True, False], [False, False]]
    assert mass_mask(m, 1.0).tolist() == [[True, True], [True, True]]
    # ties broken deterministically: lower row-major index first
    assert mass_mask(torch.full((2, 2), 0.25), 0.5).tolist() == [[True, True], [False, False]]
    assert mass_mask(torch.tensor([[0.1, 0.3, 0.3, 0.3]]), 0.4).tolist() == [[False, True, True, False]]
    assert not mass_mask(torch.zeros(3, 4)).any()
    zeros_kept = mass_mask(torch.tensor([[0.0, 1.0, 0.0]]), 1.0)
    assert zeros_kept.tolist() == [[False, True, False]]


def test_mass_mask_agrees_with_dino_rule() -> None:
    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        if trial % 2:
            m = torch.rand(3, 4, generator=g, dtype=F64) ** 3
        else:  # small integers: many ties
            m = torch.randint(0, 4, (3, 4), generator=g).double()
            if m.sum() == 0:
                continue
        for mass in (0.3, 0.6, 0.9):
            flat = torch.sort(m.reshape(-1) / m.sum(), descending=True).values
            if (torch.cumsum(flat, 0) - mass).abs().min() < 1e-9:
                continue  # exactly on the boundary: float rounding decides, both rules are ambiguous
            assert torch.equal(mass_mask(m, mass), _dino_mask(m, mass)), (m, mass)


def test_mass_mask_batched_and_minimal() -> None:
    g = torch.Generator().manual_seed(1)
    maps = torch.rand(2, 3, 4, 5, generator=g)
    mask = mass_mask(maps, 0.6)
    assert mask.shape == maps.shape and mask.dtype == torch.bool
    for i in range(2):
        for j in range(3):
            v = maps[i, j] / maps[i, j].sum()
            kept = v[mask[i, j]]
            assert kept.sum() >= 0.6 - 1e-6
            assert kept.sum() - kept.min() < 0.6  # smallest set: dropping the weakest kept token falls short
            assert kept.min() >= v[~mask[i, j]].max()  # highest tokens
    with pytest.raises(ValueError, match="mass"):
        mass_mask(maps, 0.0)


# ---------------------------------------------------------------- focus index


def test_focus_index_uniform_and_one_hot() -> None:
    k = 6
    uniform = _pattern_from_spatial(torch.full((k, k), 1 / k, dtype=F64), 1, prefix_mass=0.2)[None, None]
    torch.testing.assert_close(focus_index(uniform, (2, 3), 1), torch.full((1, 1), math.log(k), dtype=F64))
    torch.testing.assert_close(focus_index(uniform, (2, 3), 1, normalised=True), torch.ones(1, 1, dtype=F64))
    # a one-hot row has min-max [0, .., 1, .., 0] -> entropy 0; a softened one-hot too (min-max removes the floor)
    soft_one_hot = torch.full((k, k), 0.02, dtype=F64) + 0.88 * torch.eye(k, dtype=F64)
    p = _pattern_from_spatial(soft_one_hot, 0)[None, None]
    assert focus_index(p, (3, 2), 0).item() == pytest.approx(0.0, abs=1e-12)


def test_focus_index_by_hand() -> None:
    row = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=F64)
    p = row.expand(4, 4).reshape(1, 1, 4, 4).clone()
    p[0, 0, 3] = 0.25  # a uniform row: log 4
    u = torch.tensor([0.0, 1 / 6, 1 / 3, 1 / 2], dtype=F64)  # min-max [0, 1/3, 2/3, 1] / 2
    h_row = -sum(float(x) * math.log(float(x)) for x in u if x > 0)
    expected = (3 * h_row + math.log(4)) / 4
    assert focus_index(p, (2, 2), 0).item() == pytest.approx(expected, rel=1e-12)
    assert focus_index(p, (2, 2), 0, normalised=True).item() == pytest.approx(expected / math.log(4), rel=1e-12)


def test_focus_index_near_uniform_and_empty_rows_count_as_uniform() -> None:
    k = 4
    row = torch.full((k,), 0.25, dtype=F64)
    row[0] += 1e-14
    p = torch.zeros(1, 1, k + 1, k + 1, dtype=F64)
    p[0, 0, 1:, 1:] = row
    p[0, 0, 1, :] = 0.0
    p[0, 0, 1, 0] = 1.0  # all mass on CLS: spatial row is 0 -> uniform
    p[0, 0, 0, 0] = 1.0
    torch.testing.assert_close(focus_index(p, (2, 2), 1), torch.full((1, 1), math.log(k), dtype=F64))
    one = torch.ones(1, 1, 2, 2)
    assert focus_index(one, (1, 1), 1, normalised=True).item() == 0.0  # K = 1: no NaN


# ---------------------------------------------------------------- random baseline


def test_random_attention_seeded_and_normalised_over_queries() -> None:
    a = random_attention((2, 3, 5, 5), torch.Generator().manual_seed(7))
    b = random_attention((2, 3, 5, 5), torch.Generator().manual_seed(7))
    c = random_attention((2, 3, 5, 5), torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.shape == (2, 3, 5, 5) and a.dtype == torch.float32 and (a >= 0).all()
    torch.testing.assert_close(a.mean(dim=-2), torch.ones(2, 3, 5))  # mean over queries (dim -2) is 1
    assert not torch.allclose(a.sum(dim=-1), torch.ones(2, 3, 5))  # rows do not sum to 1 (as the 002 code)
    raw = torch.rand((2, 3, 5, 5), generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(a, raw / raw.mean(dim=-2, keepdim=True))
    gauss = random_attention((1, 2, 4, 4), torch.Generator().manual_seed(0), kind="gaussian", dtype=F64)
    assert gauss.dtype == F64 and (gauss >= 0).all()
    torch.testing.assert_close(gauss.mean(dim=-2), torch.ones(1, 2, 4, dtype=F64))
    with pytest.raises(ValueError, match="kind"):
        random_attention((1, 1, 2, 2), torch.Generator(), kind="laplace")
    with pytest.raises(TypeError, match="Generator"):
        random_attention((1, 1, 2, 2), 0)  # type: ignore[arg-type]


# ---------------------------------------------------------------- rollout


def _block(*rows_per_head: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows_per_head, dtype=F64).unsqueeze(0)  # [1, H, N, N]


def test_rollout_identity() -> None:
    eye = torch.eye(5).expand(2, 3, 5, 5)
    torch.testing.assert_close(rollout([eye, eye, eye]), torch.eye(5).expand(2, 5, 5))


def test_rollout_last_block_leftmost() -> None:
    a1 = _block([[1.0, 0.0], [1.0, 0.0]])  # A1 + I = [[2, 0], [1, 1]] -> [[1, 0], [.5, .5]]
    a2 = _block([[0.0, 1.0], [0.0, 1.0]])  # A2 + I = [[1, 1], [0, 2]] -> [[.5, .5], [0, 1]]
    r = rollout([a1, a2])
    torch.testing.assert_close(r[0], torch.tensor([[0.75, 0.25], [0.5, 0.5]], dtype=F64))  # A2_hat @ A1_hat
    torch.testing.assert_close(rollout([a2, a1])[0], torch.tensor([[0.5, 0.5], [0.25, 0.75]], dtype=F64))
    torch.testing.assert_close(rollout(torch.stack([a1, a2])), r)  # stacked [L, B, H, N, N]


def test_rollout_head_fusion() -> None:
    blk = _block([[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [0.5, 0.5]])
    torch.testing.assert_close(fuse_heads(blk, "mean")[0], torch.tensor([[0.5, 0.5], [0.25, 0.75]], dtype=F64))
    torch.testing.assert_close(fuse_heads(blk, "max")[0], torch.tensor([[1.0, 1.0], [0.5, 1.0]], dtype=F64))
    torch.testing.assert_close(fuse_heads(blk, "min")[0], torch.tensor([[0.0, 0.0], [0.0, 0.5]], dtype=F64))
    # max: [[1, 1], [.5, 1]] + I = [[2, 1], [.5, 2]] -> rows / [3, 2.5]
    expected = torch.tensor([[2 / 3, 1 / 3], [0.2, 0.8]], dtype=F64)
    torch.testing.assert_close(rollout([blk], head_fusion="max")[0], expected)
    with pytest.raises(ValueError, match="head_fusion"):
        rollout([blk], head_fusion="median")


def test_rollout_discard_by_hand_and_never_the_diagonal() -> None:
    blk = _block([[0.9, 0.1], [0.3, 0.7]])
    # ratio 0.25 of 4 entries -> 1 entry: the smallest off-diagonal one (0.1)
    r = rollout([blk], discard_ratio=0.25)
    torch.testing.assert_close(r[0], torch.tensor([[1.0, 0.0], [0.15, 0.85]], dtype=F64))
    # the diagonal holds the smallest values: still never discarded
    fused = torch.tensor([[[0.01, 0.5, 0.49], [0.6, 0.02, 0.38], [0.3, 0.67, 0.03]]])
    out = discard_smallest(fused, 0.5)  # floor(4.5) = 4 of the 6 off-diagonal entries
    torch.testing.assert_close(torch.diagonal(out, dim1=-2, dim2=-1), torch.diagonal(fused, dim1=-2, dim2=-1))
    assert int((out == 0).sum()) == 4
    torch.testing.assert_close(out[0], torch.tensor([[0.01, 0.0, 0.0], [0.6, 0.02, 0.0], [0.0, 0.67, 0.03]]))
    full = discard_smallest(fused, 0.99)  # capped at the off-diagonal entries
    torch.testing.assert_close(full[0], torch.diag(torch.tensor([0.01, 0.02, 0.03])))
    # per image: each image discards its own smallest entries
    two = torch.stack([fused[0], fused[0].T])
    assert torch.equal(discard_smallest(two, 0.5)[1], discard_smallest(fused[0].T[None], 0.5)[0])
    with pytest.raises(ValueError, match="discard_ratio"):
        rollout([blk], discard_ratio=1.0)


@pytest.mark.parametrize("head_fusion", ["mean", "max", "min"])
@pytest.mark.parametrize("discard_ratio", [0.0, 0.6])
def test_rollout_rows_sum_to_one(head_fusion: str, discard_ratio: float) -> None:
    blocks = [_random_pattern(2, 3, 7, seed=s, dtype=torch.float32) for s in range(4)]
    r = rollout(blocks, head_fusion=head_fusion, discard_ratio=discard_ratio)
    assert r.shape == (2, 7, 7) and r.dtype == torch.float32
    torch.testing.assert_close(r.sum(-1), torch.ones(2, 7))
    assert (torch.diagonal(r, dim1=-2, dim2=-1) > 0).all()
    rs = rollout(blocks, head_fusion=head_fusion, discard_ratio=discard_ratio, num_prefix=3)  # registers
    assert rs.shape == (2, 4, 4)
    torch.testing.assert_close(rs.sum(-1), torch.ones(2, 4))


def test_rollout_excluding_prefix_by_hand() -> None:
    # N = 3 with a CLS token; spatial rows [.2 | .6, .2] and [.5 | 0, .5]
    blk = _block([[1.0, 0.0, 0.0], [0.2, 0.6, 0.2], [0.5, 0.0, 0.5]])
    # spatial attention [[.75, .25], [0, 1]] + I = [[1.75, .25], [0, 2]] -> [[.875, .125], [0, 1]]
    r = rollout([blk], num_prefix=1)
    torch.testing.assert_close(r[0], torch.tensor([[0.875, 0.125], [0.0, 1.0]], dtype=F64))
    # num_prefix = 0 (SigLIP): rows already sum to 1, so it equals the plain rollout
    blocks = [_random_pattern(1, 2, 4, seed=s) for s in range(3)]
    torch.testing.assert_close(rollout(blocks, num_prefix=0), rollout(blocks))


def test_rollout_float64_precision_and_batch_independence() -> None:
    blocks = [_random_pattern(3, 2, 5, seed=10 + s) for s in range(3)]
    r = rollout(blocks)
    assert r.dtype == F64
    eye = torch.eye(5, dtype=F64)
    expected = None
    for p in blocks:
        a = p.mean(1) + eye
        a = a / a.sum(-1, keepdim=True)
        expected = a if expected is None else a @ expected
    torch.testing.assert_close(r, expected, rtol=0, atol=1e-14)
    for i in range(3):
        torch.testing.assert_close(rollout([p[i : i + 1] for p in blocks]), r[i : i + 1], rtol=0, atol=1e-14)


def test_rollout_bad_inputs() -> None:
    with pytest.raises(ValueError, match="at least one"):
        rollout([])
    with pytest.raises(ValueError, match="block 1"):
        rollout([torch.eye(3).expand(1, 1, 3, 3), torch.eye(4).expand(1, 1, 4, 4)])
    with pytest.raises(ValueError, match="B, H, N, N"):
        rollout([torch.eye(3)])


# ---------------------------------------------------------------- devices


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_functions_run_on_cuda_and_match_cpu() -> None:
    p = _random_pattern(2, 3, 13, seed=5)
    cuda = p.cuda()
    torch.testing.assert_close(aligned_attention(cuda, (3, 4), 1).cpu(), aligned_attention(p, (3, 4), 1))
    torch.testing.assert_close(attention_distance(cuda, (3, 4), 1).cpu(), attention_distance(p, (3, 4), 1))
    torch.testing.assert_close(focus_index(cuda, (3, 4), 1).cpu(), focus_index(p, (3, 4), 1))
    torch.testing.assert_close(rollout([cuda, cuda], num_prefix=1).cpu(), rollout([p, p], num_prefix=1))
    m = spatial_average_map(cuda, (3, 4), 1)
    assert torch.equal(mass_mask(m).cpu(), mass_mask(m.cpu()))
    g = torch.Generator(device="cuda").manual_seed(0)
    assert random_attention((1, 1, 3, 3), g).device.type == "cuda"
