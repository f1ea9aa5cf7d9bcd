"""Top-k selection over aligned tensors with a total order (so that merging is exact)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

__all__ = ["merge_topk", "topk_order"]


def topk_order(scores: torch.Tensor, ties: torch.Tensor | None, k: int, dim: int) -> torch.Tensor:
    """Positions of the ``k`` best entries along ``dim``: score descending, then ``ties`` ascending.

    Two stable sorts make the order total, so the top-k of a union equals the top-k of the two top-k sets
    merged, whatever their order.

    Args:
        scores: ``[..., n, ...]`` scores (higher first).
        ties: same shape, tie breaker (lower first), e.g. dataset indices; None keeps the input order.
        k: entries kept (fewer when ``n < k``).
        dim: the dimension to select along.

    Returns:
        int64 positions, ``scores`` with ``min(k, n)`` entries along ``dim``.
    """
    if ties is None:
        return torch.argsort(-scores, dim=dim, stable=True).narrow(dim, 0, min(k, scores.shape[dim]))
    by_tie = torch.argsort(ties, dim=dim, stable=True)
    by_score = torch.argsort(-scores.gather(dim, by_tie), dim=dim, stable=True)
    return by_tie.gather(dim, by_score).narrow(dim, 0, min(k, scores.shape[dim]))


def merge_topk(fields: Mapping[str, torch.Tensor], k: int, key: str, tie: str | None = None,
               dim: int = 0) -> dict[str, torch.Tensor]:
    """Keep the ``k`` best rows of aligned fields along ``dim`` (:func:`topk_order` on ``fields[key]``).

    Args:
        fields: name -> tensor; every tensor has the shape of ``fields[key]`` up to ``dim`` inclusive (trailing
            dimensions may differ: e.g. scores ``[C, n]`` and maps ``[C, n, h, w]`` with ``dim=1``).
        k: rows kept; key: the score field (descending); tie: the tie-breaker field (ascending).
        dim: the dimension along which candidates are laid out (non-negative).

    Returns:
        The same fields restricted to the chosen rows, in rank order.
    """
    order = topk_order(fields[key], fields[tie] if tie else None, k, dim)
    out = {}
    for name, value in fields.items():
        index = order.reshape(*order.shape, *([1] * (value.dim() - order.dim())))
        out[name] = value.gather(dim, index.expand(*order.shape, *value.shape[order.dim():]))
    return out
