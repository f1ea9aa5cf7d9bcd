"""Hand-computed cases and properties for vitscope.functional.rollout (docs/methods.md, Attention): attention
rollout, head fusion and discarding the smallest entries."""

from __future__ import annotations

import pytest
import torch

from helpers.attention_patterns import random_pattern
from vitscope.functional.rollout import discard_smallest, fuse_heads, rollout

F64 = torch.float64


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
    fewer = discard_smallest(fused, 0.3)  # floor(2.7) = 2, not round's 3: the two smallest off-diagonal entries
    torch.testing.assert_close(fewer[0], torch.tensor([[0.01, 0.5, 0.49], [0.6, 0.02, 0.0], [0.0, 0.67, 0.03]]))
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
    blocks = [random_pattern(2, 3, 7, seed=s, dtype=torch.float32) for s in range(4)]
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
    blocks = [random_pattern(1, 2, 4, seed=s) for s in range(3)]
    torch.testing.assert_close(rollout(blocks, num_prefix=0), rollout(blocks))


def test_rollout_float64_precision_and_batch_independence() -> None:
    blocks = [random_pattern(3, 2, 5, seed=10 + s) for s in range(3)]
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
