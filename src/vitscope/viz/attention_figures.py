"""Curves of the attention suite over blocks (paper 002 figures 4 and 5, attention focus lines).

matplotlib object API only (no pyplot, no backend switch), as :mod:`vitscope.viz.heatmaps`. Every function
writes ``<stem>.png`` and ``<stem>.svg`` and returns both paths. The grids of maps are in
:mod:`vitscope.viz.attention_maps`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure

from vitscope.viz.attention_maps import as_numpy as _np
from vitscope.viz.attention_maps import tick_labels as _labels
from vitscope.viz.ranges import legend_note
from vitscope.viz.save import outside_legend, save_figure

__all__ = ["block_lines_figure", "distance_figure", "saliency_figure"]


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
    outside_legend(ax, fontsize=8)
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
        legend_note(ax, [_np(per[source]) for per in models.values() if source in per])
        ax.set_xlabel("block")
        ax.set_ylabel(f"best-head IoU ({'mean of per-image max' if rule == 'image' else 'best dataset head'})")
        ax.set_title(names.get(source, source), fontsize=10)
        outside_legend(ax, fontsize=8)
    fig.tight_layout()
    return save_figure(fig, stem)


def block_lines_figure(
    series: Mapping[str, tuple[torch.Tensor | np.ndarray, torch.Tensor | np.ndarray | None]],
    title: str,
    ylabel: str,
    stem: str | Path,
    block_labels: Sequence | None = None,
    value_range: tuple[float, float] | None = None,
) -> list[Path]:
    """One line per series over blocks, with its random baseline dashed in the same colour; ``value_range``: a
    fixed value axis (a bounded quantity's range), the legend then noting the data's own range."""
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
    if value_range is not None:
        ax.set_ylim(*value_range)
        legend_note(ax, [_np(v) for pair in series.values() for v in pair if v is not None])
    ax.set_title(title, fontsize=10)
    outside_legend(ax, fontsize=8)
    fig.tight_layout()
    return save_figure(fig, stem)
