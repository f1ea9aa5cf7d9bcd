"""Attention-pattern maths of docs/methods.md, Attention (paper 002 section 4, paper 003 section 4.2).

Pure tensor functions: no I/O, no plotting, no global state. Conventions (docs/methods.md, Shared rules):

- A pattern is post-softmax attention ``[B, H, N, N]`` (any leading dims ``[..., N, N]`` work), the row
  is the query, the column the key. Tokens are ``P = num_prefix`` prefix tokens (CLS, distillation,
  registers; ``P = 0`` for SigLIP-like models) followed by the ``K = h * w`` spatial tokens row-major:
  spatial token ``(r, c)`` has index ``P + r * w + c``. Grids need not be square.
- A row or map that sums to 0 stays 0 after "renormalise".
- Computation dtype: float64 input stays float64, anything else (half, bfloat16, float32, integers) is
  computed and returned in float32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from vitscope.errors import VitscopeTypeError, VitscopeValueError
from vitscope.functional.attention_kernels import mean_spatial_focus
from vitscope.functional.attention_patterns import as_float, check_grid, check_pattern
from vitscope.functional.attention_patterns import renormalise as renormalised
from vitscope.functional.attention_stats import attention_entropy

__all__ = [
    "attention_entropy",
    "cls_attention_map",
    "focus_index",
    "mass_mask",
    "random_attention",
    "spatial_attention",
    "spatial_average_map",
]

# ---------------------------------------------------------------- maps


def spatial_attention(pattern: torch.Tensor, num_prefix: int) -> torch.Tensor:
    """Spatial attention: drop prefix rows and columns, renormalise every row to sum 1.

    A row whose spatial keys sum to 0 (all its mass on prefix tokens) stays 0.

    Args:
        pattern: ``[B, H, N, N]`` post-softmax attention.
        num_prefix: number of prefix tokens P (0 for models without CLS).

    Returns:
        ``[B, H, K, K]`` with ``K = N - P``.
    """
    check_pattern(pattern, num_prefix)
    p = int(num_prefix)
    return renormalised(as_float(pattern)[..., p:, p:])


def cls_attention_map(
    pattern: torch.Tensor, grid: Sequence[int], num_prefix: int, renormalise: bool = False
) -> torch.Tensor:
    """Attention of the CLS token (row 0) over the spatial keys, as a map.

    Args:
        pattern: ``[B, H, N, N]`` post-softmax attention.
        grid: ``(h, w)`` spatial grid, ``h * w = N - num_prefix``.
        num_prefix: number of prefix tokens; must be >= 1 (token 0 is the CLS token).
        renormalise: divide the map by its sum (a map summing to 0 stays 0). Default: raw weights.

    Returns:
        ``[B, H, h, w]``.
    """
    if int(num_prefix) < 1:
        raise VitscopeValueError("cls_attention_map needs a CLS token (num_prefix >= 1); this model has no prefix "
                                 "tokens")
    check_pattern(pattern, num_prefix, grid)
    h, w = check_grid(grid)
    m = as_float(pattern)[..., 0, int(num_prefix) :]
    if renormalise:
        m = renormalised(m)
    return m.reshape(*m.shape[:-1], h, w)


def spatial_average_map(pattern: torch.Tensor, grid: Sequence[int], num_prefix: int) -> torch.Tensor:
    """Spatial-average map: the raw rows of the spatial queries over the spatial keys, summed, then normalised.

    Rows are NOT renormalised first, so a query that puts mass on prefix tokens weighs less. The map is
    divided by its sum (a map summing to 0 stays 0).

    Args:
        pattern: ``[B, H, N, N]`` post-softmax attention.
        grid: ``(h, w)``, ``h * w = N - num_prefix``.
        num_prefix: number of prefix tokens.

    Returns:
        ``[B, H, h, w]`` summing to 1 over ``(h, w)``.
    """
    check_pattern(pattern, num_prefix, grid)
    h, w = check_grid(grid)
    p = int(num_prefix)
    m = renormalised(as_float(pattern)[..., p:, p:].sum(dim=-2))
    return m.reshape(*m.shape[:-1], h, w)


def mass_mask(attention_map: torch.Tensor, mass: float = 0.6) -> torch.Tensor:
    """Smallest set of highest tokens holding ``mass`` of an attention map (DINO's thresholding).

    The map is renormalised over its last two dims (in float64). Tokens are ranked by decreasing value,
    ties broken by lower row-major index first (stable sort); a token is kept when the mass of the tokens
    ranked before it is still below ``mass``. This is DINO's rule (sort ascending, keep tokens whose
    cumulative sum exceeds ``1 - mass``) with a deterministic tie order. An all-zero map gives all False.

    Args:
        attention_map: ``[..., h, w]`` non-negative map (CLS map or spatial-average map).
        mass: fraction of the mass to keep, in ``(0, 1]``.

    Returns:
        ``[..., h, w]`` bool mask.
    """
    if not isinstance(attention_map, torch.Tensor) or attention_map.dim() < 2:
        raise VitscopeValueError("attention_map must be a tensor [..., h, w]")
    if not 0.0 < float(mass) <= 1.0:
        raise VitscopeValueError(f"mass must be in (0, 1], got {mass}")
    shape = attention_map.shape
    flat = attention_map.to(torch.float64).reshape(*shape[:-2], -1)
    flat = renormalised(flat)
    values, order = torch.sort(flat, dim=-1, descending=True, stable=True)
    before = torch.cumsum(values, dim=-1) - values  # mass ranked strictly before each token
    keep_sorted = (before < float(mass)) & (values > 0)
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return keep.reshape(shape)


# ---------------------------------------------------------------- focus and random baseline


def focus_index(pattern: torch.Tensor, grid: Sequence[int], num_prefix: int, normalised: bool = False) -> torch.Tensor:
    """Attention focus index (paper 003 eq. 5 as reconstructed in docs/methods.md). Lower = more focused.

    For each spatial query row of the spatial attention: min-max normalise to ``[0, 1]`` (a row whose
    renormalised ``max - min < 1e-12``, including an all-zero row, counts as uniform), divide by its sum, Shannon
    entropy in nats (``0 log 0 = 0``); mean over the spatial queries. After min-max the row's minimum is
    exactly 0, so a one-hot row gives 0 and a uniform row gives ``log K``.

    Args:
        pattern: ``[B, H, N, N]`` post-softmax attention.
        grid: ``(h, w)``, ``h * w = N - num_prefix``.
        num_prefix: number of prefix tokens.
        normalised: divide by ``log K`` (values in ``[0, 1]``; with ``K = 1`` the result is 0).

    Returns:
        ``[B, H]``.
    """
    k = check_pattern(pattern, num_prefix, grid)
    sp = as_float(pattern)[..., num_prefix:, num_prefix:]
    entropy = mean_spatial_focus(sp, sp.sum(dim=-1))  # the shared attention pass's code
    if normalised:
        entropy = entropy / math.log(k) if k > 1 else torch.zeros_like(entropy)
    return entropy


def random_attention(
    shape: Sequence[int],
    generator: torch.Generator,
    kind: str = "uniform",
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Random-baseline attention pattern: random values with every row rescaled to sum 1.

    ``kind="uniform"``: ``r ~ U(0, 1)`` of ``shape``; ``kind="gaussian"``: ``|N(0, 1)|`` (half-normal) values.
    Each row (query) is divided by its sum, ``r / r.sum(dim=-1, keepdim=True)``, so the pattern is
    row-stochastic like a softmax output and every quantity derived from it (a CLS map, a rollout, an
    entropy) is in the units of the same quantity of a model (docs/methods.md, Random baselines). The 002
    code divides by the mean over queries instead (every key column has mean 1), which is not an attention
    pattern: its CLS row sums to about the number of tokens. Draws on ``generator.device`` so the same seed
    gives the same numbers.

    Args:
        shape: ``[B, H, N, N]`` (any ``[..., N, N]``).
        generator: seeded ``torch.Generator``.
        kind: ``"uniform"`` or ``"gaussian"``.
        dtype: ``torch.float32`` (default) or ``torch.float64``.

    Returns:
        Tensor of ``shape`` on the generator's device; every row sums to 1.
    """
    shape = tuple(int(v) for v in shape)
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise VitscopeValueError(f"shape must be [B, H, N, N], got {shape}")
    if not isinstance(generator, torch.Generator):
        raise VitscopeTypeError("generator must be a torch.Generator (seeded with generator.manual_seed(seed))")
    if dtype not in (torch.float32, torch.float64):
        raise VitscopeValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    if kind == "uniform":
        r = torch.rand(shape, generator=generator, dtype=dtype, device=generator.device)
    elif kind == "gaussian":
        r = torch.randn(shape, generator=generator, dtype=dtype, device=generator.device).abs()
    else:
        raise VitscopeValueError(f"kind must be 'uniform' or 'gaussian', got {kind!r}")
    total = r.sum(dim=-1, keepdim=True)
    return r.div_(torch.where(total == 0, torch.ones_like(total), total))  # in place: patterns can be large
