"""Hand-computed cases and properties for vitscope.functional.attention (docs/methods.md, Attention): spatial
attention and maps, mass masks, the focus index, the random baseline, and all of it on CUDA.

Attention distance, aligned maps and the local-head taxonomy (vitscope.functional.attention_geometry) are in
test_functional_attention_geometry.py; rollout in test_functional_rollout.py."""

from __future__ import annotations

import math

import pytest
import torch

from helpers.attention_patterns import pattern_from_spatial, random_pattern
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
from vitscope.functional.attention_geometry import aligned_attention, attention_distance
from vitscope.functional.rollout import rollout

F64 = torch.float64


# ---------------------------------------------------------------- spatial attention and maps


def test_attention_entropy_is_re_exported() -> None:
    assert attention_entropy is attention_stats.attention_entropy


@pytest.mark.parametrize("num_prefix", [0, 1, 3])
def test_spatial_attention_drops_prefix_and_renormalises(num_prefix: int) -> None:
    p = random_pattern(2, 3, 6 + num_prefix, seed=1)
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
    q = random_pattern(2, 3, 7, seed=2)
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
    uniform = pattern_from_spatial(torch.full((k, k), 1 / k, dtype=F64), 1, prefix_mass=0.2)[None, None]
    torch.testing.assert_close(focus_index(uniform, (2, 3), 1), torch.full((1, 1), math.log(k), dtype=F64))
    torch.testing.assert_close(focus_index(uniform, (2, 3), 1, normalised=True), torch.ones(1, 1, dtype=F64))
    # a one-hot row has min-max [0, .., 1, .., 0] -> entropy 0; a softened one-hot too (min-max removes the floor)
    soft_one_hot = torch.full((k, k), 0.02, dtype=F64) + 0.88 * torch.eye(k, dtype=F64)
    p = pattern_from_spatial(soft_one_hot, 0)[None, None]
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


def test_random_attention_is_seeded_and_row_stochastic_like_a_softmax() -> None:
    a = random_attention((2, 3, 5, 5), torch.Generator().manual_seed(7))
    b = random_attention((2, 3, 5, 5), torch.Generator().manual_seed(7))
    c = random_attention((2, 3, 5, 5), torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.shape == (2, 3, 5, 5) and a.dtype == torch.float32 and (a >= 0).all()
    torch.testing.assert_close(a.sum(dim=-1), torch.ones(2, 3, 5))  # every row (query) sums to 1
    raw = torch.rand((2, 3, 5, 5), generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(a, raw / raw.sum(dim=-1, keepdim=True))
    # so its CLS map is a share of the row's mass, as a model's: about K / N, not about K (the 002 code's scale)
    big = random_attention((1, 1, 50, 50), torch.Generator().manual_seed(0), dtype=F64)
    assert 0.9 < float(cls_attention_map(big, (7, 7), 1).sum()) <= 1.0
    gauss = random_attention((1, 2, 4, 4), torch.Generator().manual_seed(0), kind="gaussian", dtype=F64)
    assert gauss.dtype == F64 and (gauss >= 0).all()
    torch.testing.assert_close(gauss.sum(dim=-1), torch.ones(1, 2, 4, dtype=F64))
    with pytest.raises(ValueError, match="kind"):
        random_attention((1, 1, 2, 2), torch.Generator(), kind="laplace")
    with pytest.raises(TypeError, match="Generator"):
        random_attention((1, 1, 2, 2), 0)  # type: ignore[arg-type]


# ---------------------------------------------------------------- devices


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_functions_run_on_cuda_and_match_cpu() -> None:
    p = random_pattern(2, 3, 13, seed=5)
    cuda = p.cuda()
    torch.testing.assert_close(aligned_attention(cuda, (3, 4), 1).cpu(), aligned_attention(p, (3, 4), 1))
    torch.testing.assert_close(attention_distance(cuda, (3, 4), 1).cpu(), attention_distance(p, (3, 4), 1))
    torch.testing.assert_close(focus_index(cuda, (3, 4), 1).cpu(), focus_index(p, (3, 4), 1))
    torch.testing.assert_close(rollout([cuda, cuda], num_prefix=1).cpu(), rollout([p, p], num_prefix=1))
    m = spatial_average_map(cuda, (3, 4), 1)
    assert torch.equal(mass_mask(m).cpu(), mass_mask(m.cpu()))
    g = torch.Generator(device="cuda").manual_seed(0)
    assert random_attention((1, 1, 3, 3), g).device.type == "cuda"


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_nan_or_infinite_weight_gives_a_nan_entropy_and_focus(bad: float) -> None:
    a = torch.full((1, 1, 5, 5), 0.2)
    a[0, 0, 2, 3] = bad
    assert torch.isnan(attention_entropy(a)).all()
    assert torch.isnan(focus_index(a, (2, 2), 1)).all()
    assert torch.isfinite(attention_entropy(torch.full((1, 1, 5, 5), 0.2))).all()
