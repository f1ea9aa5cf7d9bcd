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
    """The histograms of patch-token norms of every row as one heat map: a row per block output, the norm on a log
    axis, the colour the log count (blank: no token); each row's threshold is a red bar.

    Args:
        hist: ``[R, NB]`` counts; edges: ``[NB + 1]`` norms; thresholds: ``[R]`` (NaN: none); rows: ``R`` labels.
        stem: output path without extension.
    """
    counts, edge = hist.double().numpy(), edges.double().numpy()
    used = np.flatnonzero(counts.sum(axis=0) > 0)
    lo, hi = (used[0], used[-1] + 1) if used.size else (0, counts.shape[1])
    lo, hi = max(lo - 2, 0), min(hi + 2, counts.shape[1])
    shown = np.where(counts[:, lo:hi] > 0, np.log10(np.maximum(counts[:, lo:hi], 1)), np.nan)
    logs = np.log10(edge[lo : hi + 1])
    fig = Figure(figsize=(7.5, 1.2 + 0.32 * len(rows)))
    ax = fig.add_subplot()
    image = ax.imshow(shown, aspect="auto", origin="lower", cmap="viridis", interpolation="nearest",
                      extent=(logs[0], logs[-1], -0.5, len(rows) - 0.5))
    for r in range(len(rows)):
        t = float(thresholds[r])
        if math.isfinite(t):
            ax.plot([math.log10(t)] * 2, [r - 0.45, r + 0.45], color="#c44e52", linewidth=2)
    ticks = np.arange(math.floor(logs[0]), math.ceil(logs[-1]) + 1)
    ax.set_xticks(ticks, [f"{10.0 ** t:g}" for t in ticks])
    ax.set_yticks(range(len(rows)), rows, fontsize=7)
    ax.set_xlabel("patch-token norm (log scale)")
    fig.colorbar(image, ax=ax, label="log10 tokens")
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
