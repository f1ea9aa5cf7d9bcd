"""Dense features by tiling (paper 002 appendix B.4 and its code; docs/methods.md, Representations).

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

from vitscope.errors import VitscopeValueError

__all__ = ["TilingPlan", "frame_plan", "stitch_tiles", "tiling_plan"]


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


def frame_plan(frame_hw: tuple[int, int], input_hw: tuple[int, int], patch_size: int) -> TilingPlan:
    """Plan the tiles of a frame that already has its final size (no resizing).

    Args:
        frame_hw: ``(H, W)`` pixels; multiples of ``patch_size``, at least one tile on each side.
        input_hw: ``(th, tw)`` model input (the tile); multiples of ``patch_size``.
        patch_size: p; every tile origin is a multiple of it, so tile tokens land on the frame's token grid.

    Returns:
        The :class:`TilingPlan` (``resized == frame_hw``).
    """
    h, w = (int(v) for v in frame_hw)
    th, tw = (int(v) for v in input_hw)
    p = int(patch_size)
    if p < 1 or th % p or tw % p:
        raise VitscopeValueError(f"the model input {input_hw} must be a multiple of the patch size {patch_size}")
    if h % p or w % p:
        raise VitscopeValueError(f"the frame {h}x{w} must be a multiple of the patch size {p} on both sides")
    if h < th or w < tw:
        raise VitscopeValueError(f"the frame {h}x{w} is smaller than one tile {th}x{tw}; raise scale")
    origins = tuple((top, left) for top in _starts(h, th) for left in _starts(w, tw))
    return TilingPlan(resized=(h, w), tile=(th, tw), patch=p, grid=(h // p, w // p), origins=origins)


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
        raise VitscopeValueError(f"image size must be positive, got {image_hw}")
    if p < 1 or th % p or tw % p:
        raise VitscopeValueError(f"the model input {input_hw} must be a multiple of the patch size {patch_size}")
    if not scale >= 1:
        raise VitscopeValueError(f"scale must be >= 1 so that every tile fits, got {scale!r}")
    short = int(scale * min(th, tw)) // p * p
    if h <= w:
        new_h, new_w = short, math.floor(w * short / h / p) * p
    else:
        new_h, new_w = math.floor(h * short / w / p) * p, short
    return frame_plan((new_h, new_w), (th, tw), p)


def stitch_tiles(tiles: torch.Tensor, plan: TilingPlan, stride: int | None = None) -> torch.Tensor:
    """Assemble per-tile spatial features into the dense grid (first write wins).

    Args:
        tiles: ``[T, D, th/s, tw/s]`` spatial features of the tiles in ``plan.origins`` order, or
            ``[B, T, D, th/s, tw/s]`` for a batch of frames sharing the plan.
        plan: from :func:`tiling_plan` or :func:`frame_plan`.
        stride: pixels per feature cell ``s`` (default the patch size; a CNN stage map has its own); every
            tile origin must be a multiple of it.

    Returns:
        ``[D, H/s, W/s]`` (or ``[B, D, H/s, W/s]``) dense features, same dtype and device as ``tiles``.
    """
    s = int(stride) if stride is not None else plan.patch
    th, tw = plan.tile[0] // s, plan.tile[1] // s
    if (s < 1 or plan.tile[0] % s or plan.tile[1] % s
            or any(top % s or left % s for top, left in plan.origins)):
        raise VitscopeValueError(f"stride {stride} does not divide the tile {plan.tile} and every tile origin")
    if tiles.dim() not in (4, 5) or tiles.shape[-4] != len(plan.origins) or tuple(tiles.shape[-2:]) != (th, tw):
        raise VitscopeValueError(
            f"tiles must be [{len(plan.origins)}, D, {th}, {tw}] (or with a leading batch axis) for this plan, "
            f"got {tuple(tiles.shape)}"
        )
    gh, gw = plan.resized[0] // s, plan.resized[1] // s
    out = tiles.new_zeros((*tiles.shape[:-4], tiles.shape[-3], gh, gw))
    filled = torch.zeros((gh, gw), dtype=torch.bool, device=tiles.device)
    for k, (top, left) in enumerate(plan.origins):
        r, c = top // s, left // s
        free = ~filled[r : r + th, c : c + tw]  # cells no earlier tile wrote
        region = out[..., r : r + th, c : c + tw]
        out[..., r : r + th, c : c + tw] = torch.where(free, tiles.select(-4, k), region)
        filled[r : r + th, c : c + tw] = True
    return out
