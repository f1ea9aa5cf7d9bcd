"""Figures of the artifacts analysis: token-norm histograms per block, outlier maps over images, and the
register-neuron ranking."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure

from vitscope.viz.save import save_figure

__all__ = ["neuron_ranking", "norm_histograms", "outlier_maps"]


def norm_histograms(hist: torch.Tensor, edges: torch.Tensor, thresholds: torch.Tensor, rows: Sequence[str],
                    stem: str | Path) -> list[Path]:
    """One small histogram of patch-token norms per row (log-spaced bins, log count), the threshold dashed.

    Args:
        hist: ``[R, NB]`` counts; edges: ``[NB + 1]`` norms; thresholds: ``[R]`` (NaN: none); rows: ``R`` labels.
        stem: output path without extension.
    """
    counts, edge = hist.double().numpy(), edges.double().numpy()
    used = np.flatnonzero(counts.sum(axis=0) > 0)
    lo, hi = (used[0], used[-1] + 1) if used.size else (0, counts.shape[1])
    lo, hi = max(lo - 2, 0), min(hi + 2, counts.shape[1])
    cols = min(4, len(rows))
    grid_rows = math.ceil(len(rows) / cols)
    fig = Figure(figsize=(3.2 * cols, 2.2 * grid_rows))
    for r, label in enumerate(rows):
        ax = fig.add_subplot(grid_rows, cols, r + 1)
        ax.stairs(counts[r, lo:hi], edge[lo : hi + 1], fill=True, color="#4c72b0")
        ax.set_xscale("log")
        ax.set_yscale("log")
        t = float(thresholds[r])
        if math.isfinite(t):
            ax.axvline(t, color="#c44e52", linestyle="--", linewidth=1)
        ax.set_title(label + (f" (threshold {t:.3g})" if math.isfinite(t) else ""), fontsize=8)
        ax.tick_params(labelsize=7)
        if r % cols == 0:
            ax.set_ylabel("tokens", fontsize=8)
        if r >= len(rows) - cols:
            ax.set_xlabel("norm", fontsize=8)
    return save_figure(fig, stem, layout=True)


def outlier_maps(tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any], stem: str | Path) -> list[Path]:
    """The kept images beside their patch-token norms at the row with the most outliers (outliers outlined)."""
    maps = tensors["norm_maps"].double()  # [n, R, h, w]
    fraction = tensors["outlier_fraction"].nan_to_num(0.0)
    row = int(torch.argmax(fraction)) if float(fraction.max()) > 0 else maps.shape[1] - 1
    threshold = float(tensors["threshold"][row])
    pictures = tensors.get("pictures")
    indices = tensors["norm_map_indices"].tolist()
    n = len(indices)
    fig = Figure(figsize=(2.4 * n, 4.8 if pictures is not None else 2.6))
    for j, index in enumerate(indices):
        if pictures is not None:
            ax = fig.add_subplot(2, n, j + 1)
            ax.imshow(pictures[j].numpy())
            ax.set_title(f"image {index}", fontsize=8)
            ax.axis("off")
        ax = fig.add_subplot(2 if pictures is not None else 1, n, (n if pictures is not None else 0) + j + 1)
        image = maps[j, row].numpy()
        ax.imshow(image, cmap="magma", interpolation="nearest")
        if math.isfinite(threshold):
            ys, xs = np.nonzero(image >= threshold)
            ax.scatter(xs, ys, s=30, facecolors="none", edgecolors="#55a868", linewidths=1.2)
        ax.set_title(f"{meta['rows'][row]} norms", fontsize=8)
        ax.axis("off")
    return save_figure(fig, stem, layout=True)


def neuron_ranking(neurons: Sequence[Mapping[str, Any]], stem: str | Path) -> list[Path]:
    """Horizontal bars: mean |activation| on the outliers of the top-ranked MLP units, best on top."""
    labels = [f"block {u['block']} unit {u['unit']}" for u in neurons]
    values = [u["outlier_mean"] for u in neurons]
    fig = Figure(figsize=(6.0, 0.9 + 0.32 * len(labels)))
    ax = fig.add_subplot()
    ax.barh(range(len(labels))[::-1], values, color="#8172b2")
    ax.set_yticks(range(len(labels))[::-1], labels, fontsize=8)
    for y, u in zip(range(len(labels))[::-1], neurons):
        ax.text(u["outlier_mean"], y, f"  x{u['concentration']:.3g}", va="center", fontsize=7)
    ax.set_xlabel("mean |activation| on the outlier tokens (x: over the other tokens')")
    return save_figure(fig, stem, layout=True)
