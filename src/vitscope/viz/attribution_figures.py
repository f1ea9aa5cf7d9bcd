"""The attribution figure: every image (a row) with every method's map drawn over it (a column)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

__all__ = ["attribution_grid"]


def attribution_grid(images: Sequence[np.ndarray], maps: Mapping[str, torch.Tensor], names: Sequence[str],
                     title: str, stem: str | Path, side: int = 128) -> list[Path]:
    """Images (rows) with each method's map (columns) over them, each map min-max scaled on its own for display
    only (the arrays keep the raw values); Pillow, no matplotlib.

    Args:
        images: ``[H, W, 3]`` uint8 model inputs, one per row.
        maps: method -> ``[B, h, w]`` raw maps (any grid: they are resized to the picture).
        names: a label per image.
        title: the figure's title.
        stem: output path without suffix.
        side: pixels of each cell.
    """
    from vitscope.viz.labels import short_name
    from vitscope.viz.raster import Canvas, value_overlay

    methods = list(maps)
    label_w = 110
    canvas = Canvas(label_w + (len(methods) + 1) * (side + 8) + 20, 60 + len(images) * (side + 12) + 50)
    canvas.text(10, 8, title, size=14)
    for j, method in enumerate(["image", *methods]):
        canvas.text(label_w + j * (side + 8) + side // 2, 34, method, size=11, anchor="ma")
    for r, image in enumerate(images):
        y = 52 + r * (side + 12)
        canvas.text(10, y + side // 2, short_name(names[r], 16), size=11)
        photo = np.asarray(Image.fromarray(np.asarray(image, dtype=np.uint8)).resize((side, side), Image.BILINEAR))
        canvas.paste(photo, label_w, y)
        for j, method in enumerate(methods, start=1):
            m = maps[method][r].detach().float().numpy()
            lo, hi = float(np.nanmin(m)), float(np.nanmax(m))
            scaled = (m - lo) / (hi - lo) if hi > lo else np.zeros_like(m)
            up = np.asarray(Image.fromarray(scaled.astype(np.float32), mode="F").resize((side, side), Image.BICUBIC))
            canvas.paste(value_overlay(photo, np.clip(up, 0.0, 1.0), "magma"), label_w + j * (side + 8), y)
    canvas.colour_bar(label_w, 56 + len(images) * (side + 12), min((len(methods) + 1) * (side + 8), 300), "magma",
                      "low", "high", "attribution (each map on its own scale; raw values in the arrays)")
    return canvas.save(stem)
