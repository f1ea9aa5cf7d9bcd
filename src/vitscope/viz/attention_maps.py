"""Grids of attention maps and rollout overlays (paper 002 figures 2, 3, 11 to 13, 17, 18; rollout).

Raster figures drawn with numpy and Pillow (:mod:`vitscope.viz.raster`), not matplotlib: a blocks x heads
grid is pixels with labels, written as ``<stem>.png`` in tens of milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vitscope.errors import VitscopeValueError
from vitscope.viz.labels import short_name
from vitscope.viz.raster import Canvas, colorize, fit_nearest, tick_positions, tile_scale, upscale, value_overlay

__all__ = ["aligned_maps_figure", "as_numpy", "block_head_maps", "rollout_figure", "tick_labels"]

_TYPE_SHORT = {"strict_local": "str", "offset_local": "off", "soft_local": "soft", "axial": "axi", "global": "glo"}


def as_numpy(x: torch.Tensor | np.ndarray) -> np.ndarray:
    """float64 numpy copy of a tensor (any device) or array."""
    return x.detach().cpu().double().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float64)


def tick_labels(count: int, labels: Sequence | None) -> list[str]:
    """``count`` axis labels as text (default ``0..count-1``); a wrong number of labels is an error."""
    labels = list(labels) if labels is not None else list(range(count))
    if len(labels) != count:
        raise VitscopeValueError(f"{len(labels)} block labels for {count} blocks")
    return [str(v) for v in labels]


def _scaled_tiles(arr: np.ndarray) -> np.ndarray:
    """Each ``[a, b]`` tile of ``[L, H, a, b]`` min-max scaled to ``[0, 1]`` (a constant tile becomes 0.5)."""
    lo = arr.min(axis=(-2, -1), keepdims=True)
    span = arr.max(axis=(-2, -1), keepdims=True) - lo
    return np.where(span > 0, (arr - lo) / np.where(span > 0, span, 1.0), 0.5)


def _map_grid(canvas: Canvas, maps: np.ndarray, x: int, y: int, block_labels: list[str], cmap: str,
              corner: Sequence[Sequence[str]] | None = None, centre_mark: bool = False) -> tuple[int, int]:
    """Draw the labelled blocks x heads grid of ``[L, H, a, b]`` maps with its top-left label corner at
    ``(x, y)``; returns the grid's right and bottom edges."""
    rows, cols, a, b = maps.shape
    scale = tile_scale(a, b)
    th, tw, gap = a * scale, b * scale, 2
    label_w = max(max(canvas.text_width(v, 12) for v in block_labels), canvas.text_width("block", 12)) + 8
    gx, gy = x + label_w + 6, y + 34
    canvas.text(gx + (cols * (tw + gap) - gap) / 2, y, "head", size=12, anchor="ma")
    for j in tick_positions(cols):
        canvas.text(gx + j * (tw + gap) + tw / 2, y + 16, str(j), size=12, anchor="ma")
    canvas.text(x, y + 16, "block", size=12)
    for i in tick_positions(rows):
        canvas.text(gx - 6, gy + i * (th + gap) + th / 2, block_labels[i], size=12, anchor="rm")
    tiles = colorize(_scaled_tiles(maps), cmap)  # [L, H, a, b, 3]
    for i in range(rows):
        for j in range(cols):
            tx, ty = gx + j * (tw + gap), gy + i * (th + gap)
            canvas.paste(upscale(tiles[i, j], scale), tx, ty)
            if centre_mark:
                cx, cy, r = tx + tw / 2, ty + th / 2, max(2, min(tw, th) // 10)
                canvas.draw.line([(cx - r, cy), (cx + r, cy)], fill=(230, 30, 30), width=1)
                canvas.draw.line([(cx, cy - r), (cx, cy + r)], fill=(230, 30, 30), width=1)
            if corner is not None:
                canvas.text(tx + 2, ty + 1, corner[i][j], size=max(9, min(12, th // 4)), fill=(255, 255, 255))
    return gx + cols * (tw + gap) - gap, gy + rows * (th + gap) - gap


def _grid_figure(maps: np.ndarray, title: str, stem: str | Path, labels: list[str], cmap: str,
                 image: np.ndarray | None = None, **grid: object) -> list[Path]:
    """A titled grid of maps (optionally beside the photograph they belong to) with a colour bar; PNG only."""
    rows, cols, a, b = maps.shape
    scale = tile_scale(a, b)
    canvas = Canvas(max(400, 12 * len(title)) + 400 + cols * (b * scale + 2), 160 + rows * (a * scale + 2))
    canvas.text(10, 10, title, size=15)
    x = 10
    if image is not None:
        photo = Image.fromarray(np.ascontiguousarray(image))
        height = min(320, max(96, rows * (a * scale + 2)))
        photo = photo.resize((max(1, round(photo.width * height / photo.height)), height), Image.BILINEAR)
        canvas.paste(np.asarray(photo), x, 44 + 34)
        x += photo.width + 20
    right, bottom = _map_grid(canvas, maps, x, 44, labels, cmap, **grid)
    width = max(120, min(240, right - x))
    canvas.colour_bar(max(x, right - width), bottom + 12, width, cmap, "low", "high", "each map on its own scale")
    return canvas.save(stem)


def block_head_maps(
    maps: torch.Tensor | np.ndarray,
    title: str,
    stem: str | Path,
    block_labels: Sequence | None = None,
    image: torch.Tensor | np.ndarray | None = None,
    cmap: str = "inferno",
) -> list[Path]:
    """Blocks x heads grid of attention maps (paper 002 figures 2 and 17), each tile scaled on its own.

    Args:
        maps: ``[L, H, h, w]``.
        title: figure title.
        stem: output path without extension.
        block_labels: label of each row (default ``0..L-1``).
        image: optional ``[H_px, W_px, 3]`` uint8 image drawn to the left (per-image maps).
        cmap: colour map.
    """
    arr = as_numpy(maps)
    if arr.ndim != 4:
        raise VitscopeValueError(f"expected maps [L, H, a, b], got shape {arr.shape}")
    labels = tick_labels(arr.shape[0], block_labels)
    pixels = None if image is None else np.asarray(image.cpu() if isinstance(image, torch.Tensor) else image)
    return _grid_figure(arr, title, stem, labels, cmap, image=pixels)


def aligned_maps_figure(
    aaam: torch.Tensor | np.ndarray,
    head_types: Sequence[Sequence[str]] | None,
    title: str,
    stem: str | Path,
    block_labels: Sequence | None = None,
    cmap: str = "viridis",
) -> list[Path]:
    """Blocks x heads grid of aligned aggregated attention maps (paper 002 figures 3 and 18).

    Each tile is the ``(2h-1) x (2w-1)`` map (centre = the query) scaled on its own; the centre cell is
    marked and the head type (``str`` strict, ``off`` offset, ``soft``, ``axi`` axial, ``glo`` global) is
    written in the tile's corner when ``head_types`` is given.
    """
    arr = as_numpy(aaam)
    if arr.ndim != 4:
        raise VitscopeValueError(f"expected maps [L, H, a, b], got shape {arr.shape}")
    labels = tick_labels(arr.shape[0], block_labels)
    corner = None if head_types is None else [[_TYPE_SHORT.get(t, t) for t in row] for row in head_types]
    return _grid_figure(arr, title, stem, labels, cmap, corner=corner, centre_mark=True)


def rollout_figure(
    images: torch.Tensor | np.ndarray | None,
    image_maps: torch.Tensor | np.ndarray | None,
    names: Sequence[int | str],
    mean_map: torch.Tensor | np.ndarray,
    random_map: torch.Tensor | np.ndarray | None,
    title: str,
    stem: str | Path,
    cmap: str = "inferno",
) -> list[Path]:
    """Rollout maps overlaid on the chosen images (``names``: file names, or dataset indices), then the
    dataset-mean map and the random baseline."""
    imgs = [] if images is None else [np.asarray(im.cpu() if isinstance(im, torch.Tensor) else im) for im in images]
    maps = [] if image_maps is None else [as_numpy(m) for m in image_maps]
    side = 180
    panels = []  # (label, pixels) of each map, over its image where there is one
    for img, m, name in zip(imgs, maps, names):
        h, w = np.asarray(img).shape[:2]  # the long side to ``side``, the image's own aspect ratio kept
        size = (side, max(1, round(side * h / w))) if w >= h else (max(1, round(side * w / h)), side)
        photo = Image.fromarray(np.ascontiguousarray(img)).convert("RGB").resize(size, Image.BILINEAR)
        top = np.nanmax(m) if np.isfinite(m).any() else 0.0
        label = f"image {name}" if isinstance(name, int) else short_name(str(name), 26)
        panels.append((label, value_overlay(np.asarray(photo), fit_nearest(m / top if top > 0 else m,
                                                                           (size[1], size[0])), cmap)))
    extra = [("dataset mean", as_numpy(mean_map))]
    if random_map is not None:
        extra.append(("random attention", as_numpy(random_map)))
    for name, m in extra:
        finite = m[np.isfinite(m)]
        lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        panels.append((name, upscale(colorize(m, cmap, lo, hi), max(1, side // max(m.shape)))))
    rows = -(-len(panels) // 3)  # at most three panels a row, rows balanced: labels readable on a narrow page
    cols = -(-len(panels) // rows)
    canvas = Canvas(max(20 + (side + 16) * cols, 12 * len(title)), 56 + rows * (side + 30) + 60)
    canvas.text(10, 10, title, size=15)
    for i, (label, pixels) in enumerate(panels):
        x, y = 10 + (i % cols) * (side + 16), 56 + (i // cols) * (side + 30)
        canvas.text(x + pixels.shape[1] / 2, y - 18, label, size=12, anchor="ma")
        canvas.paste(pixels, x, y)
    canvas.colour_bar(10, 56 + rows * (side + 30) - 18, max(120, min(240, cols * (side + 16) - 16)), cmap, "low",
                      "high", "each map on its own scale")
    return canvas.save(stem)
