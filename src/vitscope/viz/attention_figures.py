"""Figures of the attention suite (paper 002 figures 2 to 5, 11 to 13, 17, 18; rollout overlays).

matplotlib object API only (no pyplot, no backend switch), as :mod:`vitscope.viz.heatmaps`. Grids of
maps are drawn as one mosaic image per figure (one ``imshow``), which stays fast for 12 x 12 heads.
Every function writes ``<stem>.png`` and ``<stem>.svg`` and returns both paths.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np
import torch
from matplotlib.figure import Figure

from vitscope.viz.save import save_figure

__all__ = [
    "aligned_maps_figure",
    "block_head_maps",
    "block_lines_figure",
    "distance_figure",
    "map_mosaic",
    "rollout_figure",
    "saliency_figure",
]

_TYPE_SHORT = {"strict_local": "str", "offset_local": "off", "soft_local": "soft", "axial": "axi", "global": "glo"}


def _np(x: torch.Tensor | np.ndarray) -> np.ndarray:
    return x.detach().cpu().double().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float64)


def _labels(count: int, labels: Sequence | None) -> list[str]:
    labels = list(labels) if labels is not None else list(range(count))
    if len(labels) != count:
        raise ValueError(f"{len(labels)} block labels for {count} blocks")
    return [str(v) for v in labels]


def map_mosaic(maps: torch.Tensor | np.ndarray, gap: int = 1) -> np.ndarray:
    """Tile ``[L, H, a, b]`` maps into one ``[L*(a+gap)-gap, H*(b+gap)-gap]`` image.

    Each tile is min-max scaled to ``[0, 1]`` for display (a constant tile becomes 0.5); gaps are NaN.
    """
    arr = _np(maps)
    if arr.ndim != 4:
        raise ValueError(f"expected maps [L, H, a, b], got shape {arr.shape}")
    rows, cols, a, b = arr.shape
    lo = arr.min(axis=(-2, -1), keepdims=True)
    span = arr.max(axis=(-2, -1), keepdims=True) - lo
    tiles = np.where(span > 0, (arr - lo) / np.where(span > 0, span, 1.0), 0.5)
    out = np.full((rows * (a + gap) - gap, cols * (b + gap) - gap), np.nan)
    for i in range(rows):
        for j in range(cols):
            out[i * (a + gap):i * (a + gap) + a, j * (b + gap):j * (b + gap) + b] = tiles[i, j]
    return out


def _mosaic_axes(ax, maps: np.ndarray, block_labels: list[str], cmap: str) -> None:
    rows, cols, a, b = maps.shape
    mosaic = map_mosaic(maps)
    colormap = matplotlib.colormaps[cmap].with_extremes(bad="white")
    ax.imshow(mosaic, cmap=colormap, interpolation="nearest", vmin=0.0, vmax=1.0)
    step_c, step_r = max(1, int(np.ceil(cols / 24))), max(1, int(np.ceil(rows / 24)))
    ax.set_xticks([j * (b + 1) + (b - 1) / 2 for j in range(0, cols, step_c)], [str(j) for j in range(0, cols, step_c)])
    ax.set_yticks([i * (a + 1) + (a - 1) / 2 for i in range(0, rows, step_r)],
                  [block_labels[i] for i in range(0, rows, step_r)])
    ax.set_xlabel("head")
    ax.set_ylabel("block")
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)


def _grid_size(rows: int, cols: int, extra: float = 0.0) -> tuple[float, float]:
    return min(18.0, 1.6 + 0.75 * cols + extra), min(18.0, 1.2 + 0.75 * rows)


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
    arr = _np(maps)
    rows, cols = arr.shape[:2]
    labels = _labels(rows, block_labels)
    width, height = _grid_size(rows, cols, extra=3.0 if image is not None else 0.0)
    fig = Figure(figsize=(width, height))
    if image is not None:
        ax_img, ax = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, max(1.0, cols / 2)]})
        ax_img.imshow(np.asarray(image.cpu() if isinstance(image, torch.Tensor) else image))
        ax_img.set_axis_off()
    else:
        ax = fig.add_subplot()
    _mosaic_axes(ax, arr, labels, cmap)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, stem)


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
    arr = _np(aaam)
    rows, cols, a, b = arr.shape
    labels = _labels(rows, block_labels)
    fig = Figure(figsize=_grid_size(rows, cols))
    ax = fig.add_subplot()
    _mosaic_axes(ax, arr, labels, cmap)
    cy, cx = (a - 1) / 2, (b - 1) / 2
    ax.scatter([j * (b + 1) + cx for j in range(cols) for _ in range(rows)],
               [i * (a + 1) + cy for _ in range(cols) for i in range(rows)], s=4, c="red", marker="+", linewidths=0.5)
    if head_types is not None:
        size = max(4.0, min(7.0, 60.0 / max(rows, cols)))
        for i in range(rows):
            for j in range(cols):
                ax.text(j * (b + 1) - 0.4, i * (a + 1) - 0.4, _TYPE_SHORT.get(head_types[i][j], head_types[i][j]),
                        color="white", fontsize=size, va="top", ha="left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, stem)


def distance_figure(
    models: Mapping[str, torch.Tensor | np.ndarray],
    stem: str | Path,
    random: torch.Tensor | np.ndarray | None = None,
    block_labels: Sequence | None = None,
    title: str = "Average attention distance",
) -> list[Path]:
    """Paper 002 figure 4: each head's average attention distance per block (dots) and the block mean (line).

    Args:
        models: model name -> ``[L, H]`` distances; several models share the plot (one colour each).
        stem: output path without extension.
        random: optional ``[L, H]`` random-baseline distances (dashed grey line of the block means).
        block_labels: x labels (default ``0..L-1``).
    """
    fig = Figure(figsize=(7.0, 4.2))
    ax = fig.add_subplot()
    count = len(models)
    for m, (name, dist) in enumerate(models.items()):
        d = _np(dist)
        x = np.arange(d.shape[0])
        shift = (m - (count - 1) / 2) * 0.8 / max(count, 1) if count > 1 else 0.0
        line = ax.plot(x, d.mean(axis=1), marker="o", ms=3, label=name)[0]
        ax.scatter(np.repeat(x + shift, d.shape[1]), d.reshape(-1), s=9, alpha=0.5, color=line.get_color())
    if random is not None:
        r = _np(random)
        ax.plot(np.arange(r.shape[0]), r.mean(axis=1), ls="--", color="grey", label="random attention")
    length = max(_np(v).shape[0] for v in models.values())
    ax.set_xticks(np.arange(length), _labels(length, block_labels))
    ax.set_xlabel("block")
    ax.set_ylabel("attention distance (unit square)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, stem)


def saliency_figure(
    models: Mapping[str, Mapping[str, torch.Tensor | np.ndarray]],
    random: Mapping[str, torch.Tensor | np.ndarray] | None,
    stem: str | Path,
    block_labels: Sequence | None = None,
    rule: str = "image",
) -> list[Path]:
    """Paper 002 figure 5: best-head saliency IoU per block, one panel per map (CLS, spatial average).

    Args:
        models: model name -> {source (``"cls"``, ``"spatial"``) -> ``[L]`` best-head IoU}.
        random: source -> ``[L]`` random-baseline best-head IoU (dashed), or None.
        stem: output path without extension.
        block_labels: x labels.
        rule: the best-head rule, for the axis label.
    """
    sources = sorted({s for per in models.values() for s in per}, key=["cls", "spatial"].index)
    fig = Figure(figsize=(4.6 * len(sources), 3.8))
    axes = fig.subplots(1, len(sources), squeeze=False)[0]
    names = {"cls": "CLS attention", "spatial": "spatial-average attention"}
    for ax, source in zip(axes, sources):
        length = 0
        for name, per in models.items():
            if source in per:
                v = _np(per[source])
                length = max(length, v.shape[0])
                ax.plot(np.arange(v.shape[0]), v, marker="o", ms=3, label=name)
        if random is not None and source in random:
            r = _np(random[source])
            ax.plot(np.arange(r.shape[0]), r, ls="--", color="grey", label="random attention")
        ax.set_xticks(np.arange(length), _labels(length, block_labels))
        ax.set_ylim(0.0, 1.0)
        ax.set_xlabel("block")
        ax.set_ylabel(f"best-head IoU ({'mean of per-image max' if rule == 'image' else 'best dataset head'})")
        ax.set_title(names.get(source, source), fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, stem)


def block_lines_figure(
    series: Mapping[str, tuple[torch.Tensor | np.ndarray, torch.Tensor | np.ndarray | None]],
    title: str,
    ylabel: str,
    stem: str | Path,
    block_labels: Sequence | None = None,
) -> list[Path]:
    """One line per series over blocks, with its random baseline dashed in the same colour."""
    fig = Figure(figsize=(6.0, 3.8))
    ax = fig.add_subplot()
    length = 0
    for name, (values, baseline) in series.items():
        v = _np(values)
        length = max(length, v.shape[0])
        line = ax.plot(np.arange(v.shape[0]), v, marker="o", ms=3, label=name)[0]
        if baseline is not None:
            ax.plot(np.arange(v.shape[0]), _np(baseline), ls="--", color=line.get_color())
    ax.set_xticks(np.arange(length), _labels(length, block_labels))
    ax.set_xlabel("block")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, stem)


def _upsample(m: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Nearest-neighbour upsampling of a token map to the image size (for overlays)."""
    rows = (np.arange(size[0]) * m.shape[0] // size[0]).clip(0, m.shape[0] - 1)
    cols = (np.arange(size[1]) * m.shape[1] // size[1]).clip(0, m.shape[1] - 1)
    return m[rows][:, cols]


def rollout_figure(
    images: torch.Tensor | np.ndarray | None,
    image_maps: torch.Tensor | np.ndarray | None,
    indices: Sequence[int],
    mean_map: torch.Tensor | np.ndarray,
    random_map: torch.Tensor | np.ndarray | None,
    title: str,
    stem: str | Path,
    cmap: str = "jet",
) -> list[Path]:
    """Rollout maps overlaid on the chosen images, then the dataset-mean map and the random baseline."""
    imgs = [] if images is None else [np.asarray(im.cpu() if isinstance(im, torch.Tensor) else im) for im in images]
    maps = [] if image_maps is None else [_np(m) for m in image_maps]
    panels = len(imgs) + 1 + (random_map is not None)
    fig = Figure(figsize=(2.2 * panels, 2.6))
    axes = fig.subplots(1, panels, squeeze=False)[0]
    for ax, img, m, idx in zip(axes, imgs, maps, indices):
        ax.imshow(img)
        up = _upsample(m / m.max() if m.max() > 0 else m, img.shape[:2])
        ax.imshow(up, cmap=cmap, alpha=0.5, vmin=0.0, vmax=1.0)
        ax.set_title(f"image {idx}", fontsize=9)
    extra = [("dataset mean", mean_map)] + ([("random attention", random_map)] if random_map is not None else [])
    for ax, (name, m) in zip(axes[len(imgs):], extra):
        ax.imshow(_np(m), cmap=cmap, interpolation="nearest")
        ax.set_title(name, fontsize=9)
    for ax in axes:
        ax.set_axis_off()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, stem)
