"""Semantic and pose similarity of retrieved images (paper 000 section 5.2, figure 10).

Every image gets the distribution of its pixels over semantic classes (from any segmentation, or
ground-truth masks); the pose similarity of two images is the dot product of their distributions: high
when they show the same classes over similar areas (the same objects from similar viewpoints).
Pure tensor functions: no I/O, no plotting, no global state.
"""

from __future__ import annotations

import torch

from vitscope.errors import VitscopeValueError

__all__ = ["class_histograms", "pose_similarity"]


def class_histograms(segmentations: torch.Tensor, num_classes: int, normalize: str = "l1") -> torch.Tensor:
    """Per-image class distributions of dense label maps.

    Args:
        segmentations: ``[B, H, W]`` integer class per pixel; values outside ``[0, num_classes)`` (e.g.
            -1 or 255 for "ignore") are not counted.
        num_classes: number of classes C.
        normalize: ``"l1"`` (pixel fractions, the paper's "class distribution") or ``"l2"`` (unit vectors,
            so the dot product is a cosine).

    Returns:
        ``[B, C]`` float32; an image without counted pixels gives zeros.
    """
    if normalize not in ("l1", "l2"):
        raise VitscopeValueError(f"normalize must be 'l1' or 'l2', got {normalize!r}")
    if segmentations.dim() != 3:
        raise VitscopeValueError(f"segmentations must be [B, H, W], got {tuple(segmentations.shape)}")
    seg = segmentations.long().flatten(1)
    valid = (seg >= 0) & (seg < num_classes)
    hist = torch.zeros(seg.shape[0], num_classes, dtype=torch.float64, device=seg.device)
    hist.scatter_add_(1, seg.clamp(0, num_classes - 1), valid.double())
    norm = hist.sum(1, keepdim=True) if normalize == "l1" else hist.norm(dim=1, keepdim=True)
    return (hist / norm.clamp_min(1e-12)).float()


def pose_similarity(query: torch.Tensor, retrieved: torch.Tensor) -> torch.Tensor:
    """Dot products between each query's class distribution and those of its retrieved images.

    Args:
        query: ``[Q, C]`` distributions.
        retrieved: ``[Q, k, C]`` distributions of each query's top-k.

    Returns:
        ``[Q, k]``.
    """
    if query.dim() != 2 or retrieved.dim() != 3 or retrieved.shape[0] != query.shape[0] \
            or retrieved.shape[2] != query.shape[1]:
        raise VitscopeValueError(f"expected query [Q, C] and retrieved [Q, k, C], got {tuple(query.shape)} and "
                                 f"{tuple(retrieved.shape)}")
    return (retrieved * query.unsqueeze(1)).sum(-1)
