"""Dense features by tiling (paper 002 appendix B.4 and its code; METHODS.md section 2).

Pure functions: no I/O, no plotting, no global state. The plan: resize the image so its short side is
``scale`` (default 2) times the model input, the long side **floored** to a multiple of the patch size
(the short side too, should ``scale * input`` not be one); cut non-overlapping tiles of the model input
size, row-major; where a tile would cross the image edge it is shifted back to end at the edge, and only
the tokens no earlier tile covered are kept (first write wins). The stitched grid is ``H/p x W/p``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["TilingPlan", "stitch_tiles", "tiling_plan"]


@dataclass(frozen=True)
class TilingPlan:
    """Where the tiles of one image lie.

    Attributes:
        resized: ``(H, W)`` pixel size the image is resized to.
        tile: ``(th, tw)`` model input size (one tile).
        patch: patch size p.
        grid: ``(H // p, W // p)`` dense token grid.
        origins: ``(top, left)`` pixel of each tile, row-major (top first, then left).
    """

    resized: tuple[int, int]
    tile: tuple[int, int]
    patch: int
    grid: tuple[int, int]
    origins: tuple[tuple[int, int], ...]


def _starts(length: int, tile: int) -> list[int]:
    """Tile starts along one axis: 0, t, 2t, ... and a last tile shifted back to end at ``length``."""
    starts = list(range(0, length - tile + 1, tile))
    if starts[-1] + tile < length:
        starts.append(length - tile)
    return starts


def tiling_plan(
    image_hw: tuple[int, int], input_hw: tuple[int, int], patch_size: int, scale: float = 2.0
) -> TilingPlan:
    """Plan the tiles of an ``image_hw`` image for a model with input ``input_hw`` and patch ``patch_size``.

    Args:
        image_hw: ``(height, width)`` of the original image in pixels.
        input_hw: ``(th, tw)`` model input; both multiples of ``patch_size``.
        patch_size: p.
        scale: short side after resizing = ``scale * min(th, tw)`` (floored to a multiple of p); >= 1.

    Returns:
        The :class:`TilingPlan`.
    """
    h, w = (int(v) for v in image_hw)
    th, tw = (int(v) for v in input_hw)
    p = int(patch_size)
    if h < 1 or w < 1:
        raise ValueError(f"image size must be positive, got {image_hw}")
    if p < 1 or th % p or tw % p:
        raise ValueError(f"the model input {input_hw} must be a multiple of the patch size {patch_size}")
    if not scale >= 1:
        raise ValueError(f"scale must be >= 1 so that every tile fits, got {scale!r}")
    short = int(scale * min(th, tw)) // p * p
    if h <= w:
        new_h, new_w = short, math.floor(w * short / h / p) * p
    else:
        new_h, new_w = math.floor(h * short / w / p) * p, short
    if new_h < th or new_w < tw:
        raise ValueError(f"resized image {new_h}x{new_w} is smaller than one tile {th}x{tw}; raise scale")
    origins = tuple((top, left) for top in _starts(new_h, th) for left in _starts(new_w, tw))
    return TilingPlan(resized=(new_h, new_w), tile=(th, tw), patch=p, grid=(new_h // p, new_w // p), origins=origins)


def stitch_tiles(tiles: torch.Tensor, plan: TilingPlan) -> torch.Tensor:
    """Assemble per-tile spatial features into the dense grid (first write wins).

    Args:
        tiles: ``[T, D, th/p, tw/p]`` spatial features of the tiles, in ``plan.origins`` order.
        plan: from :func:`tiling_plan`.

    Returns:
        ``[D, H/p, W/p]`` dense features (same dtype and device as ``tiles``).
    """
    th, tw = plan.tile[0] // plan.patch, plan.tile[1] // plan.patch
    if tiles.dim() != 4 or tiles.shape[0] != len(plan.origins) or tuple(tiles.shape[2:]) != (th, tw):
        raise ValueError(
            f"tiles must be [{len(plan.origins)}, D, {th}, {tw}] for this plan, got {tuple(tiles.shape)}"
        )
    gh, gw = plan.grid
    out = tiles.new_zeros((tiles.shape[1], gh, gw))
    filled = torch.zeros((gh, gw), dtype=torch.bool, device=tiles.device)
    for tile, (top, left) in zip(tiles, plan.origins):
        r, c = top // plan.patch, left // plan.patch
        free = ~filled[r : r + th, c : c + tw]
        out[:, r : r + th, c : c + tw] = torch.where(free, tile, out[:, r : r + th, c : c + tw])
        filled[r : r + th, c : c + tw] = True
    return out
