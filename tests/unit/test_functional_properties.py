"""Property tests of the functional core (hypothesis): invariants that hold for any shape, prefix count and dtype.

The budget is small (a few dozen examples each, no deadline) so the suite keeps its time; every property is
one a wrong implementation breaks.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vitscope.errors import VitscopeValueError
from vitscope.functional.attention import cls_attention_map, spatial_average_map
from vitscope.functional.attention_stats import attention_entropy, max_attention
from vitscope.functional.cka import linear_cka
from vitscope.functional.rollout import rollout

FAST = settings(max_examples=25, deadline=None)
PREFIX = st.sampled_from([0, 1, 2, 5])
GRID = st.tuples(st.integers(1, 5), st.integers(1, 6))  # non-square grids included
FLOATS = st.sampled_from([torch.float32, torch.float64])


def _softmax_pattern(seed: int, batch: int, heads: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(batch, heads, n, n, generator=gen, dtype=torch.float64) * 3, -1).to(dtype)


@FAST
@given(seed=st.integers(0, 10_000), n=st.integers(4, 24), d=st.integers(2, 12), scale=st.floats(0.01, 100.0))
def test_cka_is_invariant_to_orthogonal_maps_and_isotropic_scaling(seed: int, n: int, d: int, scale: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    y = torch.randn(n, d + 1, generator=gen, dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    base = linear_cka(x, y)
    assert 0.0 <= base <= 1.0 + 1e-12
    assert math.isclose(linear_cka(scale * x @ q, y), base, rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(linear_cka(x, x), 1.0, rel_tol=1e-9)


@FAST
@given(seed=st.integers(0, 10_000), batch=st.integers(1, 3), blocks=st.integers(1, 4), n=st.integers(1, 12))
def test_rollout_of_identity_attention_is_the_identity(seed: int, batch: int, blocks: int, n: int) -> None:
    eye = torch.eye(n, dtype=torch.float64).expand(batch, 2, n, n).clone()
    r = rollout([eye] * blocks)
    assert torch.allclose(r, torch.eye(n, dtype=torch.float64).expand(batch, n, n))
    rows = rollout([_softmax_pattern(seed + b, batch, 2, n, torch.float64) for b in range(blocks)]).sum(-1)
    assert torch.allclose(rows, torch.ones_like(rows))  # every A_hat is row-stochastic, so is R


@FAST
@given(seed=st.integers(0, 10_000), grid=GRID, p=PREFIX, heads=st.integers(1, 3), dtype=FLOATS)
def test_entropy_and_max_are_bounded_for_any_prefix_and_grid(seed: int, grid: tuple[int, int], p: int, heads: int,
                                                             dtype: torch.dtype) -> None:
    n = p + grid[0] * grid[1]
    a = _softmax_pattern(seed, 2, heads, n, dtype)
    ent, peak = attention_entropy(a), max_attention(a)
    assert ent.shape == peak.shape == (2, heads)
    assert (ent >= -1e-5).all() and (ent <= math.log(n) + 1e-4).all()
    assert (peak >= 1.0 / n - 1e-6).all() and (peak <= 1.0 + 1e-6).all()


@FAST
@given(seed=st.integers(0, 10_000), grid=GRID, p=PREFIX, dtype=FLOATS)
def test_spatial_average_maps_sum_to_one_and_cls_maps_need_a_cls(seed: int, grid: tuple[int, int], p: int,
                                                                 dtype: torch.dtype) -> None:
    n = p + grid[0] * grid[1]
    a = _softmax_pattern(seed, 2, 2, n, dtype)
    sam = spatial_average_map(a, grid, p)
    assert sam.shape[-2:] == grid
    sums = sam.reshape(*sam.shape[:-2], -1).sum(-1).double()
    assert torch.allclose(sums, torch.ones_like(sums), atol=1e-5)
    if p == 0:
        with pytest.raises(VitscopeValueError, match="needs a CLS token"):
            cls_attention_map(a, grid, p)
    else:
        cls = cls_attention_map(a, grid, p)
        assert cls.shape[-2:] == grid and (cls >= 0).all()


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_patterns_give_a_clear_error_or_a_nan_never_a_plain_number(bad: float) -> None:
    a = _softmax_pattern(0, 1, 1, 5, torch.float64)
    a[0, 0, 2, 3] = bad
    try:
        ent = attention_entropy(a)
    except ValueError:
        return  # refused: fine
    assert not torch.isfinite(ent).all()  # or the NaN shows: a silent finite number would be wrong


HALF = st.sampled_from([torch.float16, torch.bfloat16])


@FAST
@given(seed=st.integers(0, 10_000), grid=GRID, p=PREFIX, dtype=HALF)
def test_half_precision_patterns_are_computed_in_float32(seed: int, grid: tuple[int, int], p: int,
                                                         dtype: torch.dtype) -> None:
    """fp16/bf16 inputs (autocast runs) give the float32 result of the same values, never a half-precision sum."""
    n = p + grid[0] * grid[1]
    a = _softmax_pattern(seed, 2, 2, n, dtype)
    same_values = a.float()
    for fn in (attention_entropy, max_attention):
        got = fn(a)
        assert got.dtype == torch.float32 and torch.isfinite(got).all()
        assert torch.equal(got, fn(same_values))
    sam = spatial_average_map(a, grid, p)
    assert sam.dtype == torch.float32 and torch.equal(sam, spatial_average_map(same_values, grid, p))
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(seed)).to(dtype)
    assert linear_cka(x, x * 2) == pytest.approx(1.0, rel=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_empty_batches_give_empty_results_and_cka_refuses_them(dtype: torch.dtype) -> None:
    empty = torch.zeros(0, 3, 10, 10, dtype=dtype)
    assert attention_entropy(empty).shape == max_attention(empty).shape == (0, 3)
    assert spatial_average_map(empty, (3, 3), 1).shape == (0, 3, 3, 3)
    assert rollout([empty, empty]).shape == (0, 10, 10)
    with pytest.raises(VitscopeValueError, match="no examples"):
        linear_cka(torch.zeros(0, 4), torch.zeros(0, 3))


@FAST
@given(seed=st.integers(0, 10_000), grid=GRID, p=PREFIX, dtype=FLOATS)
def test_spatial_rows_sum_to_one_after_renormalising_and_distances_stay_in_the_unit_square(
        seed: int, grid: tuple[int, int], p: int, dtype: torch.dtype) -> None:
    from vitscope.functional.attention import spatial_attention
    from vitscope.functional.attention_geometry import attention_distance

    n = p + grid[0] * grid[1]
    a = _softmax_pattern(seed, 2, 2, n, dtype)
    rows = spatial_attention(a, p).sum(-1).double()
    assert torch.allclose(rows, torch.ones_like(rows), atol=1e-5)
    d = attention_distance(a, grid, p)
    assert d.shape == (2, 2) and (d >= 0).all() and (d <= math.sqrt(2) + 1e-6).all()


@FAST
@given(seed=st.integers(0, 10_000), grid=GRID, mass=st.floats(0.05, 1.0))
def test_mass_mask_keeps_the_fewest_top_tokens_holding_the_mass(seed: int, grid: tuple[int, int], mass: float) -> None:
    from vitscope.functional.attention import mass_mask

    m = torch.rand(*grid, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + 1e-3
    keep = mass_mask(m, mass)
    share = m / m.sum()
    assert share[keep].sum() >= mass - 1e-9  # holds the mass
    if keep.sum() > 1:  # and dropping its smallest kept token would not
        assert share[keep].sum() - share[keep].min() < mass + 1e-9
    if (~keep).any():
        assert share[keep].min() >= share[~keep].max()  # and they are the top tokens
