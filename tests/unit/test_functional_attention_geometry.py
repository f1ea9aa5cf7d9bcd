"""Hand-computed cases and properties for vitscope.functional.attention_geometry (docs/methods.md, Attention):
attention distance, aligned attention maps and their offsets, and the local-head taxonomy, on square and
non-square grids, checked against loop references."""

from __future__ import annotations

import math

import pytest
import torch

from helpers.attention_patterns import pattern_from_spatial, random_pattern
from vitscope.functional.attention_geometry import (
    HEAD_TYPES,
    aligned_attention,
    aligned_offset,
    attention_distance,
    local_head_type,
)

F64 = torch.float64


# ---------------------------------------------------------------- loop references and canvases


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


# ---------------------------------------------------------------- attention distance


def test_distance_one_hot_on_non_square_grid() -> None:
    # grid 2 x 3: token (r, c) at (c / 2, r / 1). Every spatial query attends only to (1, 2) = (1, 1).
    k = 6
    spatial = torch.zeros(k, k, dtype=F64)
    spatial[:, 5] = 1.0
    p = pattern_from_spatial(spatial, num_prefix=1, prefix_mass=0.5)[None, None]  # half the mass on CLS
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
    p = pattern_from_spatial(torch.eye(12, dtype=F64), num_prefix=2)[None, None]
    assert attention_distance(p, (3, 4), 2).item() == 0.0


@pytest.mark.parametrize(("grid", "num_prefix"), [((2, 3), 1), ((3, 2), 0), ((1, 4), 2), ((4, 4), 5), ((14, 14), 1)])
def test_distance_and_aligned_match_loop_reference(grid: tuple[int, int], num_prefix: int) -> None:
    k = grid[0] * grid[1]
    b, nh = (1, 2) if k > 100 else (2, 3)
    p = random_pattern(b, nh, k + num_prefix, seed=k + num_prefix)
    if num_prefix:
        p[0, 0, num_prefix] = 0.0
        p[0, 0, num_prefix, 0] = 1.0  # one spatial query with all its mass on a prefix token
    torch.testing.assert_close(attention_distance(p, grid, num_prefix), _loop_distance(p, grid, num_prefix))
    torch.testing.assert_close(aligned_attention(p, grid, num_prefix), _loop_aligned(p, grid, num_prefix))


# ---------------------------------------------------------------- aligned maps and offsets


def test_aligned_self_attention_is_one_at_centre() -> None:
    p = pattern_from_spatial(torch.eye(6, dtype=F64), num_prefix=1, prefix_mass=0.3)[None, None]
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
    p = random_pattern(2, 3, 7, seed=3, dtype=torch.float32)
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
