"""Token pooling for region-level features (docs/methods.md, Representations, "Clustering": object / part level).

Pure tensor functions: no I/O, no plotting, no global state.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from vitscope.errors import VitscopeTypeError, VitscopeValueError

__all__ = ["mask_pool", "mask_weights", "random_features"]


def mask_weights(masks: torch.Tensor | np.ndarray, grid: tuple[int, int]) -> torch.Tensor:
    """Token weights of region masks: each mask resized to the token grid by area, normalised to sum 1.

    The weight of token (r, c) is the fraction of its pixel cell the mask covers (``adaptive_avg_pool2d``;
    exact cells when the mask size is a multiple of the grid), then the weights of a mask are divided by
    their sum. A mask that covers no token keeps all-zero weights.

    Args:
        masks: ``[M, H, W]`` masks (bool or float in [0, 1]) in the pixel frame of the model input.
        grid: ``(h, w)`` token grid.

    Returns:
        ``[M, h*w]`` float64 weights, rows summing to 1 (or 0 for an empty mask), row-major tokens.
    """
    m = torch.as_tensor(np.asarray(masks)) if not isinstance(masks, torch.Tensor) else masks.detach().cpu()
    if m.dim() != 3:
        raise VitscopeValueError(f"masks must be [M, H, W], got shape {tuple(m.shape)}")
    h, w = (int(v) for v in grid)
    if m.shape[0] == 0:
        return torch.zeros((0, h * w), dtype=torch.float64)
    area = F.adaptive_avg_pool2d(m.to(torch.float64).unsqueeze(1), (h, w)).reshape(m.shape[0], h * w)
    total = area.sum(dim=1, keepdim=True)
    return torch.where(total > 0, area / torch.where(total > 0, total, torch.ones_like(total)), area)


def mask_pool(tokens: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted mean of spatial tokens per region.

    Args:
        tokens: ``[K, D]`` spatial tokens (row-major grid), or ``[B, K, D]``.
        weights: ``[M, K]`` (or ``[B, M, K]``) weights, each row summing to 1 (:func:`mask_weights`).

    Returns:
        ``[M, D]`` (or ``[B, M, D]``) region features in float64.
    """
    if tokens.dim() not in (2, 3) or weights.dim() != tokens.dim() or weights.shape[-1] != tokens.shape[-2]:
        raise VitscopeValueError(
            f"tokens [K, D] need weights [M, K] (or batched [B, K, D] / [B, M, K]); got {tuple(tokens.shape)} "
            f"and {tuple(weights.shape)}"
        )
    return weights.to(torch.float64) @ tokens.detach().to(torch.float64)


def random_features(
    shape: tuple[int, ...] | torch.Size, generator: torch.Generator, kind: str = "uniform"
) -> torch.Tensor:
    """Random-chance features of a given shape, as the 002 code's random baseline (docs/methods.md, Attention).

    Args:
        shape: the shape of the real features, e.g. ``[n, D]``.
        generator: seeded ``torch.Generator`` (the same seed gives the same features).
        kind: ``"uniform"`` (U(0, 1), the code's default) or ``"gaussian"`` (N(0, 1), the paper's text).

    Returns:
        float32 tensor of ``shape`` on the generator's device.
    """
    if not isinstance(generator, torch.Generator):
        raise VitscopeTypeError("generator must be a torch.Generator (seeded with generator.manual_seed(seed))")
    shape = tuple(int(s) for s in shape)
    if kind == "uniform":
        return torch.rand(shape, generator=generator, device=generator.device)
    if kind == "gaussian":
        return torch.randn(shape, generator=generator, device=generator.device)
    raise VitscopeValueError(f"kind must be 'uniform' or 'gaussian', got {kind!r}")
