"""Synthetic attention patterns shared by the tests of ``vitscope.functional`` attention and rollout."""

from __future__ import annotations

import torch

F64 = torch.float64


def pattern_from_spatial(spatial: torch.Tensor, num_prefix: int, prefix_mass: float = 0.0) -> torch.Tensor:
    """Embed a spatial pattern [..., K, K] into [..., N, N]: prefix rows uniform, spatial rows scaled so that
    ``prefix_mass`` of every spatial row goes to the prefix keys (spread evenly)."""
    k = spatial.shape[-1]
    n = k + num_prefix
    out = torch.zeros(*spatial.shape[:-2], n, n, dtype=spatial.dtype)
    out[..., :num_prefix, :] = 1.0 / n
    out[..., num_prefix:, num_prefix:] = spatial * (1.0 - prefix_mass)
    if num_prefix:
        out[..., num_prefix:, :num_prefix] = prefix_mass / num_prefix
    return out


def random_pattern(b: int, h: int, n: int, seed: int, dtype: torch.dtype = F64, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(scale * torch.randn(b, h, n, n, generator=g, dtype=dtype), dim=-1)

