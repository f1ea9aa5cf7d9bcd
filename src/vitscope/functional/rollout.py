"""Attention rollout (Abnar & Zuidema 2020) as docs/methods.md, Attention and the paper-000 code define it.

Pure tensor functions: no I/O, no plotting, no global state.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vitscope.errors import VitscopeValueError
from vitscope.functional.attention import spatial_attention

__all__ = ["HEAD_FUSIONS", "discard_smallest", "fuse_heads", "rollout", "rollout_step"]

HEAD_FUSIONS: tuple[str, ...] = ("mean", "max", "min")


def fuse_heads(pattern: torch.Tensor, head_fusion: str = "mean") -> torch.Tensor:
    """Fuse the heads of one block's pattern.

    Args:
        pattern: ``[B, H, N, N]``.
        head_fusion: ``"mean"``, ``"max"`` or ``"min"`` over the head dim.

    Returns:
        ``[B, N, N]`` in the pattern's dtype.
    """
    if head_fusion == "mean":
        return pattern.mean(dim=1)
    if head_fusion == "max":
        return pattern.amax(dim=1)
    if head_fusion == "min":
        return pattern.amin(dim=1)
    raise VitscopeValueError(f"head_fusion must be one of {HEAD_FUSIONS}, got {head_fusion!r}")


def discard_smallest(fused: torch.Tensor, discard_ratio: float) -> torch.Tensor:
    """Zero, per image, the ``discard_ratio`` fraction of the smallest entries of a map, never the diagonal.

    ``n = floor(discard_ratio * N * N)`` entries are zeroed (at most the ``N * N - N`` off-diagonal ones),
    chosen among the off-diagonal entries by increasing value; ties are broken by lower row-major index
    first (stable sort), so the result is deterministic.

    Args:
        fused: ``[B, N, N]`` head-fused attention.
        discard_ratio: fraction in ``[0, 1)``.

    Returns:
        ``[B, N, N]`` copy with the discarded entries set to 0.
    """
    if not 0.0 <= float(discard_ratio) < 1.0:
        raise VitscopeValueError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
    b, n, _ = fused.shape
    count = min(int(float(discard_ratio) * n * n), n * n - n)
    if count == 0:
        return fused.clone()
    eye = torch.eye(n, dtype=torch.bool, device=fused.device).reshape(1, n * n)
    ranked = fused.reshape(b, n * n).masked_fill(eye, float("inf"))
    order = torch.sort(ranked, dim=-1, stable=True).indices[:, :count]
    out = fused.reshape(b, n * n).clone()
    out.scatter_(1, order, 0.0)
    return out.reshape(b, n, n)


def rollout(
    patterns: Sequence[torch.Tensor] | torch.Tensor,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    num_prefix: int | None = None,
) -> torch.Tensor:
    """Attention rollout ``R = A_hat_L @ ... @ A_hat_1`` (last block leftmost, as the paper-000 code).

    Per block: fuse the heads (``head_fusion``); when ``num_prefix`` is given take the spatial attention
    of the fused map (prefix rows and columns dropped, rows renormalised; a row with no spatial mass
    stays 0); then, if ``discard_ratio > 0``, zero that fraction of the smallest entries per image, never
    the diagonal (:func:`discard_smallest`); ``A_hat = A + I`` with rows renormalised to sum 1. Every
    ``A_hat`` is row-stochastic, so every row of ``R`` sums to 1. ``R[q, k]`` is the flow from input
    token k to output token q. Paper 000's eq. 5 writes the product in the other order; the code (and
    vitscope) multiplies each new block on the left.

    Args:
        patterns: per-block patterns ``[B, H, N, N]``, first block first (a list, or a stacked
            ``[L, B, H, N, N]`` tensor).
        head_fusion: ``"mean"`` (default), ``"max"`` or ``"min"``.
        discard_ratio: fraction in ``[0, 1)`` of the smallest fused entries to zero (default 0).
        num_prefix: ``None`` keeps every token (``[B, N, N]``); an int P excludes the P prefix tokens
            (``0`` is valid and keeps all tokens, renormalising rows).

    Returns:
        ``[B, N, N]``, or ``[B, K, K]`` with ``K = N - P`` when ``num_prefix`` is given; float64 for
        float64 input, float32 otherwise.
    """
    blocks = list(patterns.unbind(0)) if isinstance(patterns, torch.Tensor) else list(patterns)
    if not blocks:
        raise VitscopeValueError("rollout needs at least one block's attention pattern")
    shape = blocks[0].shape
    for i, p in enumerate(blocks):
        if not isinstance(p, torch.Tensor) or p.dim() != 4 or p.shape[-1] != p.shape[-2]:
            raise VitscopeValueError(f"block {i}: expected an attention pattern [B, H, N, N], got "
                                     f"{getattr(p, 'shape', p)}")
        if p.shape != shape:
            raise VitscopeValueError(f"block {i} has shape {tuple(p.shape)} but block 0 has {tuple(shape)}")
    if head_fusion not in HEAD_FUSIONS:
        raise VitscopeValueError(f"head_fusion must be one of {HEAD_FUSIONS}, got {head_fusion!r}")
    if not 0.0 <= float(discard_ratio) < 1.0:
        raise VitscopeValueError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
    dtype = torch.float64 if blocks[0].dtype == torch.float64 else torch.float32
    result: torch.Tensor | None = None
    for p in blocks:
        result = rollout_step(result, fuse_heads(p.to(dtype), head_fusion), discard_ratio, num_prefix)
    assert result is not None
    return result


def rollout_step(result: torch.Tensor | None, fused: torch.Tensor, discard_ratio: float = 0.0,
                 num_prefix: int | None = None) -> torch.Tensor:
    """One block of :func:`rollout`: ``A_hat @ result`` (``A_hat`` alone for the first block).

    Lets a caller fold blocks in as the model produces them, holding one ``[B, N, N]`` product instead of
    every block's pattern.

    Args:
        result: the rollout of the blocks before (None before the first block).
        fused: ``[B, N, N]`` this block's head-fused attention (:func:`fuse_heads`), float32 or float64.
        discard_ratio: as :func:`rollout`.
        num_prefix: as :func:`rollout`.

    Returns:
        ``[B, N, N]`` (``[B, K, K]`` with ``num_prefix``), the rollout up to this block.
    """
    a = fused
    if num_prefix is not None:
        a = spatial_attention(a, num_prefix)
    if discard_ratio > 0:
        a = discard_smallest(a, discard_ratio)
    a = a + torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    a = a / a.sum(dim=-1, keepdim=True)
    return a if result is None else a @ result
