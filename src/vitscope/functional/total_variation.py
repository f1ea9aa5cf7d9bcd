"""Total variation of image batches, as the feature-visualisation code of paper 001 computes it."""

from __future__ import annotations

import torch

from vitscope.errors import VitscopeValueError

__all__ = ["total_variation"]


def total_variation(images: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Unsquared L2 total variation over four directions (docs/methods.md, Feature visualisation).

    For every image and channel the L2 norm (not squared) of the horizontal, vertical and both diagonal
    difference maps is taken; each direction is averaged over channels (and over images with
    ``reduction="mean"``) and the four directions are summed.

    Args:
        images: ``[B, C, H, W]`` float (H, W >= 2).
        reduction: ``"mean"`` -> scalar tensor (average over images), ``"none"`` -> ``[B]`` per image.

    Returns:
        A 0-d tensor or ``[B]`` (differentiable).
    """
    if images.dim() != 4 or images.shape[-1] < 2 or images.shape[-2] < 2:
        raise VitscopeValueError(f"total_variation expects [B, C, H, W] with H, W >= 2, got {tuple(images.shape)}")
    if reduction not in ("mean", "none"):
        raise VitscopeValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
    x = images
    diffs = (
        x[..., :, 1:] - x[..., :, :-1],  # horizontal
        x[..., 1:, :] - x[..., :-1, :],  # vertical
        x[..., 1:, 1:] - x[..., :-1, :-1],  # diagonal
        x[..., 1:, :-1] - x[..., :-1, 1:],  # anti-diagonal
    )
    # [B, C] norm per direction, averaged over channels -> [B]; eps keeps the gradient finite on flat images
    per_image = sum((d.square().sum(dim=(-2, -1)) + 1e-12).sqrt().mean(dim=1) for d in diffs)
    return per_image.mean() if reduction == "mean" else per_image
