"""Concept labels of tokens from labelled pixels: a token holds a concept when more than half of its pixels do.

Pure tensor functions: no I/O, no plotting, no global state.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from vitscope.errors import VitscopeValueError

__all__ = ["token_concept_fractions", "token_concepts"]


def _concept_counts(labels: torch.Tensor, membership: torch.Tensor, grid: Sequence[int]) -> tuple[torch.Tensor, int]:
    """``[B, h*w, C]`` float64 counts of every token's pixels in each concept (whole numbers), and a cell's pixels."""
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
    ch, cw = height // h, width // w
    cells = labels.reshape(b, h, ch, w, cw).permute(0, 1, 3, 2, 4).reshape(b, h * w, ch * cw)
    per_label = F.one_hot(cells, membership.shape[0]).sum(dim=2).to(torch.float64)  # [B, h*w, S]
    return per_label @ membership.to(torch.float64), ch * cw


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
    counts, cell = _concept_counts(labels, membership, grid)
    return counts / cell


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
    counts, cell = _concept_counts(labels, membership, grid)
    return 2 * counts > cell
