"""Figures of paper 001: unit grids (figs. 1, 7), the standard panel (fig. 2), token-mixing plots (fig. 6).

matplotlib object API only (no pyplot), so these work headless and leave the user's backend alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure

from vitscope.viz.ranges import bar_label, legend_note
from vitscope.viz.save import outside_legend, save_figure

__all__ = ["isolate_cls_figure", "map_cell", "panel_figure", "spatial_information_figure", "token_accuracy_figure",
           "top_activation_grid", "unit_grid_figure"]


def _rgb(image: torch.Tensor | np.ndarray) -> np.ndarray:
    """``[3, H, W]`` float in [0, 1] or ``[H, W, 3]`` uint8 -> ``[H, W, 3]`` float in [0, 1]."""
    arr = image.detach().cpu().numpy() if isinstance(image, torch.Tensor) else np.asarray(image)
    if arr.ndim == 3 and arr.shape[0] == 3 and arr.shape[-1] != 3:
        arr = arr.transpose(1, 2, 0)
    arr = arr.astype(np.float64)
    if arr.max() > 1.0 + 1e-6:
        arr = arr / 255.0
    return np.clip(arr, 0.0, 1.0)


#: images a row of a unit grid holds at most
MAX_COLUMNS = 4


def _off(ax) -> None:
    ax.set_xticks([])
    ax.set_yticks([])


def unit_grid_figure(images: torch.Tensor, labels: Sequence[str], path: str | Path, columns: int | None = None,
                     title: str = "") -> Path:
    """Optimised images in a grid (rows = blocks when ``columns`` = units per block): figs. 1 and 7.

    Args:
        images: ``[U, 3, H, W]`` in [0, 1].
        labels: one label per image.
        path: PNG to write.
        columns: images per row (default: all in one row), at most :data:`MAX_COLUMNS` (more wrap: the labels
            stay readable when the picture is scaled to a page).
    """
    u = images.shape[0]
    cols = min(columns or u, MAX_COLUMNS)
    rows = int(np.ceil(u / cols))
    fig = Figure(figsize=(1.8 * cols, 1.9 * rows), layout="constrained")  # the title just above the first row
    for i in range(rows * cols):
        ax = fig.add_subplot(rows, cols, i + 1)
        _off(ax)
        if i < u:
            ax.imshow(_rgb(images[i]))
            ax.set_title(labels[i], fontsize=7)
        else:
            ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=9)
    return save_figure(fig, path, dpi=110, svg=False, tight=True)[0]


def panel_figure(optimised: torch.Tensor, top_images: Sequence[torch.Tensor | np.ndarray], maps: torch.Tensor,
                 label: str, path: str | Path, scores: Sequence[float] | None = None,
                 names: Sequence[str] | None = None) -> Path:
    """The standard panel (fig. 2): the optimised image and the top dataset images in one row, each image's
    patch activation map under it.

    Args:
        optimised: ``[3, H, W]`` in [0, 1].
        top_images: the k most-activating images as the model saw them (``[3, H, W]`` or ``[H, W, 3]``).
        maps: ``[k, h, w]`` the unit's activation on each image's patches.
        label: the unit's name.
        path: PNG to write.
        scores: the unit's score (mean activation) on each top image.
        names: the file name of each top image (under its map).
    """
    from vitscope.viz.labels import short_name

    k = len(top_images)
    fig = Figure(figsize=(1.6 * (1 + k), 3.7))
    ax = fig.add_subplot(2, 1 + k, 1)
    ax.imshow(_rgb(optimised))
    ax.set_title(f"{label}\noptimised", fontsize=9)
    _off(ax)
    fig.add_subplot(2, 1 + k, 2 + k).axis("off")
    vmax = float(maps.max()) if maps.numel() else 1.0
    vmin = float(maps.min()) if maps.numel() else 0.0
    shown = None
    for j in range(k):
        img = _rgb(top_images[j])
        ax = fig.add_subplot(2, 1 + k, 2 + j)
        ax.imshow(img)
        ax.set_title(f"top {j + 1}" + (f" ({scores[j]:.2f})" if scores is not None else ""), fontsize=9)
        _off(ax)
        ax = fig.add_subplot(2, 1 + k, 3 + k + j)
        ax.imshow(img, alpha=0.35)
        shown = ax.imshow(maps[j].detach().cpu().numpy(), cmap="magma", alpha=0.75, vmin=vmin, vmax=vmax,
                          extent=(0, img.shape[1], img.shape[0], 0), interpolation="nearest")
        ax.set_title(short_name(names[j], 16) if names and j < len(names) else f"map {j + 1}", fontsize=9)
        _off(ax)
    if shown is not None:  # one scale for the k maps: the unit's activation on a patch, beside the last map
        pos = fig.axes[-1].get_position()
        bar = fig.colorbar(shown, cax=fig.add_axes((pos.x1 + 0.01, pos.y0, 0.012, pos.height)))
        bar.set_label("activation", fontsize=9)
        bar.ax.tick_params(labelsize=8)
    return save_figure(fig, path, dpi=110, svg=False, tight=True)[0]


def map_cell(values: torch.Tensor, picture: torch.Tensor | np.ndarray | None, side: int) -> np.ndarray:
    """One patch map ``[h, w]`` min-max scaled on its own (magma), drawn over its ``[S, S, 3]`` uint8 picture in grey
    (or alone): ``[side, side, 3]`` uint8."""
    from PIL import Image

    from vitscope.viz.raster import colorize, value_overlay

    m = values.detach().float().numpy()
    lo, hi = float(np.nanmin(m)), float(np.nanmax(m))
    scaled = (m - lo) / (hi - lo) if hi > lo else np.zeros_like(m)
    up = np.asarray(Image.fromarray(scaled.astype(np.float32), mode="F").resize((side, side), Image.BICUBIC))
    if picture is None:
        return colorize(np.clip(up, 0.0, 1.0), "magma")
    photo = Image.fromarray(np.asarray(picture, dtype=np.uint8)).resize((side, side), Image.BILINEAR)
    return value_overlay(np.asarray(photo), up, "magma")  # the photo in grey, coloured where the unit fires


def top_activation_grid(maps: torch.Tensor | Sequence[Sequence[torch.Tensor]], scores: torch.Tensor,
                        units: Sequence[str],
                        pictures: Sequence[Sequence[torch.Tensor | None]], site: str, stem: str | Path,
                        side: int = 96, names: Sequence[Sequence[str | None]] | None = None) -> list[Path]:
    """The top images of several units, each with the unit's patch map drawn over it (Pillow, no matplotlib).

    Args:
        maps: ``[U, k, h, w]`` patch activation maps, or ``maps[u][j]`` ``[h, w]`` each (images of several token
            grids); each min-max scaled on its own, magma.
        scores: ``[U, k]`` the units' scores on those images (shown above them).
        units: a label per unit (row).
        pictures: ``pictures[u][j]`` the ``[S, S, 3]`` uint8 image under map ``(u, j)``, or None (map alone).
        site: the hook name, in the title.
        stem: output path without suffix.
        side: pixels of each cell.
        names: ``names[u][j]`` the file name of image ``(u, j)`` (written under it, cut in the middle), or None.
    """
    from vitscope.viz.labels import short_name
    from vitscope.viz.raster import Canvas

    u, k = len(maps), len(maps[0]) if len(maps) else 0
    label_w = 70
    row = side + (38 if names else 24)
    canvas = Canvas(label_w + k * (side + 8) + 20, 40 + u * row + 50)
    canvas.text(10, 8, f"Top activations: {site}", size=14)
    for r in range(u):
        y = 34 + r * row
        canvas.text(10, y + 14 + side // 2, str(units[r]), size=11)
        for j in range(k):
            x = label_w + j * (side + 8)
            picture = pictures[r][j] if r < len(pictures) and j < len(pictures[r]) else None
            cell = map_cell(maps[r][j], picture, side)
            canvas.text(x + side // 2, y, f"{float(scores[r, j]):.2f}", size=10, anchor="ma")
            canvas.paste(cell, x, y + 14)
            name = names[r][j] if names and r < len(names) and j < len(names[r]) else None
            if name:
                canvas.text(x + side // 2, y + 16 + side, short_name(name, 16), size=10, anchor="ma",
                            fill=(91, 100, 117))
    bottom = 34 + u * row + 4
    canvas.colour_bar(label_w, bottom, min(k * (side + 8) - 8, 300), "magma", "low", "high",
                      "unit activation over the image's patches (each map on its own scale)")
    return canvas.save(stem)


def token_accuracy_figure(grid_accuracy: torch.Tensor, cls_accuracy: float, path: str | Path,
                          title: str = "head applied to each patch token") -> Path:
    """Heat map of accuracy per spatial token position (fig. 6); the CLS accuracy in the title."""
    fig = Figure(figsize=(4.2, 3.6))
    ax = fig.add_subplot(1, 1, 1)
    grid = grid_accuracy.detach().cpu().numpy()
    im = ax.imshow(grid, cmap="viridis", vmin=0.0, vmax=1.0)  # an accuracy, on its range
    fig.colorbar(im, ax=ax, label=bar_label("accuracy", grid))
    ax.set_title(f"{title}\n(CLS token: {cls_accuracy:.3f})", fontsize=8)
    ax.set_xlabel("column")
    ax.set_ylabel("row")
    return save_figure(fig, path, dpi=110, svg=False, tight=True)[0]


def isolate_cls_figure(accuracy: torch.Tensor, path: str | Path, chance: float | None = None) -> Path:
    """Accuracy when CLS joins the patches only from block L on, against L (``accuracy [L + 1]``)."""
    fig = Figure(figsize=(4.2, 3.0))
    ax = fig.add_subplot(1, 1, 1)
    xs = np.arange(accuracy.numel())
    ax.plot(xs, accuracy.detach().cpu().numpy(), marker="o")
    if chance is not None:
        ax.axhline(chance, color="grey", ls="--", lw=0.8, label="chance")
    legend_note(ax, accuracy)  # an accuracy on its range: where the data lie
    outside_legend(ax, fontsize=7)
    ax.set_xlabel("block where CLS is inserted (0 = unmodified model)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.set_title("isolating CLS until block L", fontsize=8)
    return save_figure(fig, path, dpi=110, svg=False, tight=True)[0]


def spatial_information_figure(fractions: torch.Tensor, count_ratio: torch.Tensor, sum_ratio: torch.Tensor,
                               labels: Sequence[str], path: str | Path) -> Path:
    """Ratio of active patches (count, sum) against the fraction of active patches removed, one line per block.

    Args:
        fractions: ``[F]``; count_ratio, sum_ratio: ``[L, F]``; labels: ``L`` line labels.
    """
    fig = Figure(figsize=(7.5, 3.0))
    x = fractions.detach().cpu().numpy()
    for col, (ratio, what) in enumerate(((count_ratio, "count"), (sum_ratio, "sum"))):
        ax = fig.add_subplot(1, 2, col + 1)
        for i, lab in enumerate(labels):
            ax.plot(x, ratio[i].detach().cpu().numpy(), marker=".", label=lab)
        ax.plot(x, 1 - x, color="grey", ls="--", lw=0.8, label="linear (1 - x)")
        ax.set_xlabel("fraction of active patches removed")
        ax.set_ylabel(f"active patches ({what}) / initial")
        outside_legend(ax, fontsize=6)
    return save_figure(fig, path, dpi=110, svg=False, tight=True)[0]
