"""Concept and region labels of tokens from labelled pixels or masks: a token holds a concept (shows a region) when
more than half of its pixels do.

Pure tensor functions: no I/O, no plotting, no global state.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from vitscope.errors import VitscopeValueError

__all__ = ["BACKGROUND", "token_concept_fractions", "token_concepts", "token_coverage", "token_region_labels"]

#: the region label of a token that no region covers by a majority
BACKGROUND = -1


def token_coverage(masks: torch.Tensor, grid: Sequence[int]) -> torch.Tensor:
    """The share of every token's pixels inside each mask: ``[n, H, W]`` bool -> ``[n, h * w]`` float64.

    The frame is averaged over the ``h x w`` grid: exact shares when ``H`` and ``W`` are multiples of the grid (a
    patch grid over the model's input), an area average otherwise. Every token-majority rule here reads these
    shares, so "more than half of its pixels" means the same thing everywhere.
    """
    h, w = (int(v) for v in grid)
    if masks.shape[0] == 0:
        return torch.zeros(0, h * w, dtype=torch.float64)
    pooled = F.adaptive_avg_pool2d(masks.to(torch.float64)[:, None], (h, w))  # [n, 1, h, w]
    return pooled.reshape(masks.shape[0], h * w)


def token_region_labels(coverage: torch.Tensor, labels: torch.Tensor, majority: float = 0.5) -> torch.Tensor:
    """Every token's region label: the label of the region covering most of its pixels when it covers more than
    ``majority`` of them, else :data:`BACKGROUND` (regions may overlap, as COCO's instance masks do).

    Args:
        coverage: ``[n, K]`` shares (:func:`token_coverage`); labels: ``[n]`` int label of each region.
        majority: the share a region needs.

    Returns:
        ``[K]`` int64.
    """
    k = coverage.shape[-1]
    if coverage.shape[0] == 0:
        return torch.full((k,), BACKGROUND, dtype=torch.int64)
    best, which = coverage.max(dim=0)
    out = torch.as_tensor(labels, dtype=torch.int64)[which]
    return torch.where(best > majority, out, torch.full_like(out, BACKGROUND))


def _concept_shares(labels: torch.Tensor, membership: torch.Tensor, grid: Sequence[int]) -> torch.Tensor:
    """``[B, h*w, C]`` float64 share of every token's pixels in each concept (:func:`token_coverage` of each
    concept's pixels)."""
    if labels.dim() != 3 or membership.dim() != 2:
        raise VitscopeValueError(f"labels must be [B, H, W] and membership [S, C], got {tuple(labels.shape)} and "
                                 f"{tuple(membership.shape)}")
    b, height, width = labels.shape
    h, w = (int(v) for v in grid)
    if h < 1 or w < 1 or height % h or width % w:
        raise VitscopeValueError(f"labels must be [B, H, W] with H, W multiples of the grid {h}x{w}, got "
                                 f"{tuple(labels.shape)}")
    labels = labels.long()
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= membership.shape[0]):
        raise VitscopeValueError(f"pixel labels must lie in [0, {membership.shape[0]}), got "
                                 f"[{int(labels.min())}, {int(labels.max())}]")
    c = membership.shape[1]
    masks = membership.bool()[labels].permute(0, 3, 1, 2).reshape(b * c, height, width)  # [B*C, H, W]
    return token_coverage(masks, (h, w)).reshape(b, c, h * w).transpose(1, 2)


def token_concept_fractions(labels: torch.Tensor, membership: torch.Tensor, grid: Sequence[int]) -> torch.Tensor:
    """The share of every token's pixels that belong to each concept.

    Every pixel carries one label (a segment of the image: the background, one part of one object...); a label
    belongs to any number of concepts. Token ``(r, c)`` is the pixel cell ``r`` and ``c`` of the ``h x w`` grid
    (a ViT's patch: ``H`` and ``W`` must be multiples of the grid).

    Args:
        labels: ``[B, H, W]`` integer pixel labels in ``[0, S)``, in the pixel frame of the model input.
        membership: ``[S, C]`` bool: which concepts each label belongs to.
        grid: ``(h, w)`` token grid.

    Returns:
        ``[B, h*w, C]`` float64 shares in ``[0, 1]``, tokens row-major.
    """
    return _concept_shares(labels, membership, grid)


def token_concepts(labels: torch.Tensor, membership: torch.Tensor, grid: Sequence[int]) -> torch.Tensor:
    """Which concepts every token holds: those covering more than half of its pixels (a tie holds neither).

    Unlike ``mask_to_grid`` (a token is in a mask when any of its pixels is) this is the token's majority, so a
    token holds at most one concept of a partition of the image (object or background; one class of the objects).

    Args:
        labels: ``[B, H, W]`` integer pixel labels in ``[0, S)``; membership: ``[S, C]`` bool; grid: ``(h, w)``
            (:func:`token_concept_fractions`).

    Returns:
        ``[B, h*w, C]`` bool.
    """
    return _concept_shares(labels, membership, grid) > 0.5
