"""Guided MAE masking (docs/methods.md, SIFT patch interrelation): counts, keypoint share, spill-over, curriculum."""

from __future__ import annotations

import pytest
import torch

from vitscope.functional import curriculum_rho, guided_mask, guided_visible_ids
from vitscope.functional.guided_mask import guided_mask_counts


def _counts(num_key: int, grid=(8, 8), seed: int = 0) -> torch.Tensor:
    k = grid[0] * grid[1]
    flat = torch.zeros(k, dtype=torch.long)
    idx = torch.randperm(k, generator=torch.Generator().manual_seed(seed))[:num_key]
    flat[idx] = torch.randint(1, 4, (num_key,), generator=torch.Generator().manual_seed(seed + 1))
    return flat.reshape(grid)


@pytest.mark.parametrize("ratio", [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0])
@pytest.mark.parametrize("rho", [0.0, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("num_key", [0, 10, 40, 64])
def test_exact_count_and_keypoint_share(ratio: float, rho: float, num_key: int) -> None:
    counts = _counts(num_key)
    mask = guided_mask(counts, ratio, rho, torch.Generator().manual_seed(0))
    k = counts.numel()
    m = int(ratio * k + 0.5)
    assert mask.dtype == torch.bool and mask.shape == counts.shape
    assert int(mask.sum()) == m
    want_key = int(rho * m + 0.5)
    want_key = min(want_key, num_key)  # too few keypoint patches: the rest are non-keypoint patches
    want_key = max(want_key, m - (k - num_key))  # too few non-keypoint patches: the rest are keypoint ones
    assert int((mask & (counts > 0)).sum()) == want_key


def test_rho_extremes_and_determinism() -> None:
    counts = _counts(30)
    only_plain = guided_mask(counts, 0.25, 0.0, torch.Generator().manual_seed(1))
    assert not (only_plain & (counts > 0)).any()
    only_key = guided_mask(counts, 0.25, 1.0, torch.Generator().manual_seed(1))
    assert (only_key <= (counts > 0)).all()
    a = guided_mask(counts, 0.5, 0.5, torch.Generator().manual_seed(7))
    b = guided_mask(counts, 0.5, 0.5, torch.Generator().manual_seed(7))
    c = guided_mask(counts, 0.5, 0.5, torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_split_counts_and_errors() -> None:
    assert guided_mask_counts(10, 54, 48, 0.5) == (10, 38)  # keypoint group too small
    assert guided_mask_counts(60, 4, 48, 0.0) == (44, 4)  # plain group too small
    assert guided_mask_counts(30, 34, 48, 0.25) == (14, 34)  # 36 plain wanted, 34 exist
    assert guided_mask_counts(30, 34, 48, 0.5) == (24, 24)
    with pytest.raises(ValueError, match="rho"):
        guided_mask(_counts(5), 0.5, 1.5, torch.Generator())
    with pytest.raises(ValueError, match="mask_ratio"):
        guided_mask(_counts(5), -0.1, 0.5, torch.Generator())


def test_visible_ids_are_the_complement() -> None:
    counts = torch.stack([_counts(n, seed=n) for n in (0, 20, 64)])
    ids = guided_visible_ids(counts, keep=16, rho=1.0, generator=torch.Generator().manual_seed(0))
    assert ids.shape == (3, 16)
    for row, c in zip(ids, counts.flatten(1)):
        assert len(set(row.tolist())) == 16
        masked = torch.ones(64, dtype=torch.bool)
        masked[row] = False
        # 48 masked: as many keypoint patches as exist (up to 48), the rest non-keypoint
        assert int((masked & (c > 0)).sum()) == min(48, int((c > 0).sum()))


def test_curriculum() -> None:
    assert [curriculum_rho(e, every=2) for e in range(12)] == [0, 0, .25, .25, .5, .5, .75, .75, 1, 1, 1, 1]
    assert curriculum_rho(3, every=1, levels=(0.0, 1.0)) == 1.0
    with pytest.raises(ValueError, match="every"):
        curriculum_rho(0, every=0)
