"""Checking and normalising attention patterns: the shared first step of every function in
:mod:`vitscope.functional.attention` and :mod:`vitscope.functional.attention_geometry` (conventions there)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vitscope.errors import VitscopeTypeError, VitscopeValueError

__all__ = ["as_float", "check_grid", "check_pattern", "renormalise"]


def as_float(x: torch.Tensor) -> torch.Tensor:
    """float64 stays float64, everything else becomes float32."""
    return x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)


def renormalise(x: torch.Tensor, dims: int | tuple[int, ...] = -1) -> torch.Tensor:
    """Divide by the sum over ``dims``; a slice summing to 0 stays 0."""
    s = x.sum(dim=dims, keepdim=True)
    return x / torch.where(s == 0, torch.ones_like(s), s)


def check_grid(grid: Sequence[int]) -> tuple[int, int]:
    """``(h, w)`` of a grid, or a ValueError naming what was given."""
    try:
        h, w = (int(v) for v in grid)
    except (TypeError, ValueError):
        raise VitscopeValueError(f"grid must be a pair (h, w) of positive ints, got {grid!r}") from None
    if h < 1 or w < 1:
        raise VitscopeValueError(f"grid must be a pair (h, w) of positive ints, got {grid!r}")
    return h, w


def check_pattern(pattern: torch.Tensor, num_prefix: int, grid: Sequence[int] | None = None) -> int:
    """Validate ``[..., N, N]`` and the prefix/grid split; return K = N - num_prefix."""
    if not isinstance(pattern, torch.Tensor):
        raise VitscopeTypeError(f"pattern must be a torch.Tensor, got {type(pattern).__name__}")
    if pattern.dim() < 2 or pattern.shape[-1] != pattern.shape[-2]:
        raise VitscopeValueError(
            f"pattern must be an attention pattern [B, H, N, N] (queries x keys), got shape {tuple(pattern.shape)}"
        )
    n = pattern.shape[-1]
    if not 0 <= int(num_prefix) < n:
        raise VitscopeValueError(f"num_prefix must be in [0, N) with N = {n} tokens, got {num_prefix}")
    k = n - int(num_prefix)
    if grid is not None:
        h, w = check_grid(grid)
        if h * w != k:
            raise VitscopeValueError(
                f"grid {h}x{w} has {h * w} spatial tokens but the pattern has N - num_prefix = {n} - {num_prefix}"
                f" = {k}; pass the model's grid and its number of prefix tokens (CLS, distillation, registers)"
            )
    return k
