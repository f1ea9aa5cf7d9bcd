"""Per-head summary statistics of attention patterns (docs/methods.md, Attention, "Attention entropy").

Pure tensor functions: no I/O, no plotting, no global state. Patterns follow the vitscope
convention: post-softmax, rows are queries and columns are keys.
"""

from __future__ import annotations

import torch

from vitscope.errors import VitscopeTypeError, VitscopeValueError
from vitscope.functional.attention_kernels import mean_row_entropy

__all__ = ["attention_entropy", "max_attention"]


def _compute_dtype(pattern: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    """float64 stays float64, anything else is computed in float32 unless ``dtype`` says otherwise."""
    if dtype is not None:
        if dtype not in (torch.float32, torch.float64):
            raise VitscopeValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        return dtype
    return torch.float64 if pattern.dtype == torch.float64 else torch.float32


def _check_pattern(pattern: torch.Tensor) -> None:
    if not isinstance(pattern, torch.Tensor):
        raise VitscopeTypeError(f"pattern must be a torch.Tensor, got {type(pattern).__name__}")
    if pattern.dim() < 2:
        raise VitscopeValueError(
            f"pattern must be an attention pattern [B, H, N, N] (queries x keys), got shape {tuple(pattern.shape)}"
        )


def attention_entropy(pattern: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Plain Shannon entropy of every attention row, averaged over query rows.

    For each query row ``a_q`` (over ALL keys, prefix tokens included) the entropy is
    ``-sum_k a_qk * log(a_qk)`` in nats with ``0 * log 0 = 0``; the result is the mean over
    queries. Rows are used as given (not renormalised); tiny negative values from numerical
    noise count as 0. The shared attention pass computes it with the same code
    (:func:`~vitscope.functional.attention_kernels.mean_row_entropy`). A uniform row over N keys gives
    ``log N``, a one-hot row gives 0.

    Args:
        pattern: ``[B, H, N, N]`` post-softmax attention (any leading dims ``[..., Nq, Nk]`` work).
        dtype: computation dtype, ``torch.float32`` or ``torch.float64``. Default: float64 for
            float64 input, float32 otherwise (half / bfloat16 inputs are upcast).

    Returns:
        ``[B, H]`` (the leading dims) mean row entropy in nats, in the computation dtype.
    """
    _check_pattern(pattern)
    return mean_row_entropy(pattern.to(_compute_dtype(pattern, dtype)))


def max_attention(pattern: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Largest attention weight of every query row, averaged over query rows.

    A uniform row over N keys gives ``1 / N``, a one-hot row gives 1.

    Args:
        pattern: ``[B, H, N, N]`` post-softmax attention (any leading dims ``[..., Nq, Nk]`` work).
        dtype: computation dtype as in :func:`attention_entropy`.

    Returns:
        ``[B, H]`` (the leading dims) mean over queries of the row maximum.
    """
    _check_pattern(pattern)
    p = pattern.to(_compute_dtype(pattern, dtype))
    return p.amax(dim=-1).mean(dim=-1)
