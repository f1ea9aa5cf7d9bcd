"""HSIC between many Gram matrices at once (docs/methods.md, Representations), for CKA matrices over blocks and models.

Pure tensor functions: no I/O, no plotting, no global state. They compute exactly the estimators of
:func:`vitscope.functional.cka.hsic` (biased ``tr(K H L H) / (n-1)^2`` and the unbiased Song et al.
estimator), but for every pair of a stack of Grams with matrix products instead of one pair at a time:

- biased: ``tr(K H L H) = <H K H, H L H>_F``, so centre every Gram once and take one matrix product of
  the flattened centred Grams;
- unbiased (on the centred Grams, diagonals zeroed): ``tr(K L) = <K, L>_F``, ``1^T K 1`` = the sum of K, and
  ``1^T K L 1 = (K 1) . (L 1)``, so three products give every pair.

Grams must be symmetric (linear Grams ``X X^T`` are). Arithmetic runs in float64.
"""

from __future__ import annotations

import numpy as np
import torch

from vitscope.errors import VitscopeValueError
from vitscope.functional.cka import _minmax_gram, centred_grams

__all__ = ["cka_from_hsic", "cross_gram", "grams", "hsic_matrix", "row_norms"]

_BLOCK_BYTES = 512 << 10  # small float64 working blocks: reused from the heap, not mapped anew each time


def _column_chunk(rows: int, column_chunk: int | None) -> int:
    return int(column_chunk) if column_chunk else max(256, min(16384, _BLOCK_BYTES // (8 * max(rows, 1))))

_MIN_UNBIASED = 4


def grams(features: torch.Tensor, gram_minmax: bool = False) -> torch.Tensor:
    """Linear Grams ``X_a X_a^T`` of a stack of representations of the same examples.

    Args:
        features: ``[A, n, F]`` (A representations of n examples; trailing dims beyond F are not allowed).
        gram_minmax: rescale each Gram as the 002 code, ``K - min(K)`` then divided by its shifted maximum.

    Returns:
        ``[A, n, n]`` float64.
    """
    if features.dim() != 3:
        raise VitscopeValueError(f"features must be [A, n, F], got shape {tuple(features.shape)}")
    x = features.detach().to(torch.float64)
    k = x @ x.transpose(1, 2)
    if gram_minmax:
        k = torch.stack([_minmax_gram(g) for g in k])
    return k


def cross_gram(x: torch.Tensor | np.ndarray, y: torch.Tensor | np.ndarray | None = None,
               column_chunk: int | None = None, device: torch.device | None = None) -> torch.Tensor:
    """Linear Gram block ``X Y^T`` in float64, converting a few feature columns at a time.

    Exact float64 products without a float64 copy of the whole features: for ``[64, 151296]`` float32
    features (ViT-B/16, every token) the float64 working set is under 1 MiB instead of 77 MiB, and it is
    faster (small blocks are reused from the heap instead of being page-faulted in anew each time).

    Args:
        x: ``[a, F]`` features (torch, on any device, or numpy, e.g. a memory map); trailing dims flattened.
        y: ``[b, F]`` features on the same device (None: ``x``).
        column_chunk: feature columns converted to float64 at a time (default: blocks of at most 512 KiB).
        device: where the products are made (default: the device of ``x``, CPU for numpy input); rows
            elsewhere are copied there a block at a time.

    Returns:
        ``[a, b]`` float64 on ``device``.
    """
    def rows(v: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
        return v.reshape(v.shape[0], -1)

    xs = rows(x)
    ys = xs if y is None else rows(y)
    if xs.shape[1] != ys.shape[1]:
        raise VitscopeValueError(f"x and y must have the same feature width, got {tuple(xs.shape)} and "
                                 f"{tuple(ys.shape)}")

    def part(v: torch.Tensor | np.ndarray, start: int) -> torch.Tensor:
        block = v[:, start : start + column_chunk]
        if isinstance(block, np.ndarray):
            return torch.from_numpy(np.asarray(block, dtype=np.float64)).to(device)
        return block.detach().to(device=device, dtype=torch.float64)

    column_chunk = _column_chunk(max(xs.shape[0], ys.shape[0]), column_chunk)
    if device is None:
        device = xs.device if isinstance(xs, torch.Tensor) else torch.device("cpu")
    out = torch.zeros((xs.shape[0], ys.shape[0]), dtype=torch.float64, device=device)
    for start in range(0, xs.shape[1], column_chunk):
        xb = part(xs, start)
        yb = xb if y is None else part(ys, start)
        out += xb @ yb.T
    return out


def row_norms(x: torch.Tensor, column_chunk: int | None = None) -> torch.Tensor:
    """``[n]`` float64 Euclidean norms of the rows of ``[n, F]`` features, a few columns at a time."""
    x = x.detach().reshape(x.shape[0], -1)
    chunk = _column_chunk(x.shape[0], column_chunk)
    sq = torch.zeros(x.shape[0], dtype=torch.float64, device=x.device)
    for start in range(0, x.shape[1], chunk):
        sq += x[:, start : start + chunk].to(torch.float64).square().sum(dim=1)
    return sq.sqrt()


def _check(k: torch.Tensor, name: str) -> torch.Tensor:
    if k.dim() != 3 or k.shape[-1] != k.shape[-2]:
        raise VitscopeValueError(f"{name} must be a stack of square Grams [A, n, n], got shape {tuple(k.shape)}")
    return k.detach().to(torch.float64)


def hsic_matrix(k: torch.Tensor, l: torch.Tensor | None = None, unbiased: bool = False) -> torch.Tensor:  # noqa: E741
    """HSIC of every pair ``(k[a], l[b])`` of two stacks of symmetric Gram matrices.

    Args:
        k: ``[A, n, n]`` Grams of A representations.
        l: ``[B, n, n]`` Grams of B representations of the same n examples; None means ``k`` (then the
            result is symmetric and its diagonal holds the self-HSICs).
        unbiased: the unbiased estimator (needs n >= 4; diagonals are zeroed on copies here).

    Returns:
        ``[A, B]`` float64, entry ``[a, b]`` equal to ``hsic(k[a], l[b], unbiased)``.
    """
    k = _check(k, "k")
    l = k if l is None else _check(l, "l")  # noqa: E741
    if k.shape[1:] != l.shape[1:]:
        raise VitscopeValueError(f"k and l must hold Grams of the same n examples, got {tuple(k.shape)} and "
                                 f"{tuple(l.shape)}")
    n = k.shape[-1]
    least = _MIN_UNBIASED if unbiased else 2
    if n < least:
        raise VitscopeValueError(f"{'unbiased' if unbiased else 'biased'} HSIC needs at least {least} examples, "
                                 f"got n={n}")
    kc = centred_grams(k)  # both estimators are invariant to it; flat Grams become zero (functional.cka)
    lc = kc if l is k else centred_grams(l)
    if not unbiased:
        return kc.reshape(k.shape[0], -1) @ lc.reshape(l.shape[0], -1).T / (n - 1) ** 2
    kz = kc
    kz.diagonal(dim1=-2, dim2=-1).zero_()  # a copy of the caller's Grams: zeroed in place
    lz = kz if l is k else lc
    if l is not k:
        lz.diagonal(dim1=-2, dim2=-1).zero_()
    trace_kl = kz.reshape(kz.shape[0], -1) @ lz.reshape(lz.shape[0], -1).T  # tr(K L) for symmetric L
    rows_k, rows_l = kz.sum(dim=2), lz.sum(dim=2)  # K 1, L 1: [A, n], [B, n]
    sum_k, sum_l = rows_k.sum(dim=1), rows_l.sum(dim=1)  # 1^T K 1
    k_l_ones = rows_k @ rows_l.T  # 1^T K L 1
    value = trace_kl + torch.outer(sum_k, sum_l) / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * k_l_ones
    return value / (n * (n - 3))


def cka_from_hsic(hsic_xy: torch.Tensor, hsic_xx: torch.Tensor, hsic_yy: torch.Tensor) -> torch.Tensor:
    """``CKA[a, b] = hsic_xy[a, b] / sqrt(hsic_xx[a] * hsic_yy[b])``; NaN where the product is not positive.

    Args:
        hsic_xy: ``[A, B]`` cross HSICs.
        hsic_xx: ``[A]`` self-HSICs of the rows.
        hsic_yy: ``[B]`` self-HSICs of the columns.

    Returns:
        ``[A, B]`` float64.
    """
    denom = torch.outer(hsic_xx.to(torch.float64), hsic_yy.to(torch.float64))
    safe = torch.where(denom > 0, denom, torch.ones_like(denom))
    out = hsic_xy.to(torch.float64) / safe.sqrt()
    return torch.where(denom > 0, out, torch.full_like(out, float("nan")))
