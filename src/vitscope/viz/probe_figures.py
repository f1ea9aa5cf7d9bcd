"""Probe curves per block (paper 002 figures 9, 10 and 28 to 31) and clustering curves (7, 8, 24 to 27)."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure

from vitscope.viz.ranges import PROBE_RANGE, legend_note, quantity_range
from vitscope.viz.representation_figures import curves_figure
from vitscope.viz.save import outside_legend, save_figure

__all__ = ["models_probe_curves", "probe_curves"]


def probe_curves(
    curves: Mapping[str, torch.Tensor | np.ndarray | Sequence[float]],
    metric: str,
    title: str,
    out_path_stem: str | Path,
    random: float | None = None,
    blocks: Sequence[int] | None = None,
) -> list[Path]:
    """One probe metric per block for one or several models, with the random-chance score dashed.

    Args:
        curves: ``{model: [L] scores}``.
        metric: y-axis label (e.g. ``"accuracy"``, ``"J&F"``, ``"PCK@0.1"``).
        title: figure title; out_path_stem: output path without extension.
        random: random-chance score (drawn as a dashed line), if known.
        blocks: block number of each point (default ``0..L-1``).

    Returns:
        ``[<stem>.png, <stem>.svg]``.
    """
    baselines = {"random chance": random} if random is not None else None
    return curves_figure(curves, title, metric, out_path_stem, baselines=baselines, x_values=blocks,
                         ylim=quantity_range(metric) or PROBE_RANGE)


def models_probe_curves(results: Mapping[str, Mapping[str, object]], out_dir: str | Path) -> list[Path]:
    """Per-block curves of several models for every task and metric (figures 9, 10, 28 to 31).

    Each model is drawn at its own blocks (``meta["blocks"]``: models of different depth side by side) with its own
    random-chance score dashed in its colour (random features of its own shape score differently); every metric
    that some model has gets a figure.

    Args:
        results: ``{model: {task: ProbeResult}}`` (e.g. one :func:`vitscope.downstream.sweep.probe_sweep` per model).
        out_dir: folder for ``compare_<task>_<metric>.png|svg``.

    Returns:
        The written files.
    """
    tasks: dict[str, dict[str, object]] = {}
    for model, per_task in results.items():
        for task, res in per_task.items():
            tasks.setdefault(task, {})[model] = res
    paths: list[Path] = []
    for task, per_model in tasks.items():
        metrics = dict.fromkeys(m for r in per_model.values() for m in r.meta.get("metrics", []))  # in order, once
        for metric in metrics:
            drawn = {m: r for m, r in per_model.items() if metric in r.tensors}
            if not drawn:
                continue
            curves = {m: (r.meta.get("blocks") or range(len(r.tensors[metric])), r.tensors[metric])
                      for m, r in drawn.items()}
            randoms = {m: float(r.tensors[f"random_{metric}"]) for m, r in drawn.items()
                       if f"random_{metric}" in r.tensors}
            stem = Path(out_dir) / f"compare_{task}_{metric.replace('@', '_at_').replace('&', 'and')}"
            paths += _models_figure(curves, randoms, metric, f"{task}: {metric} per block", stem)
    return paths


def _models_figure(
    curves: Mapping[str, tuple[Sequence[int], torch.Tensor | np.ndarray | Sequence[float]]],
    randoms: Mapping[str, float],
    metric: str,
    title: str,
    out_path_stem: str | Path,
) -> list[Path]:
    """One line per model over its own blocks, each model's random-chance score dashed in the model's colour.

    Args:
        curves: ``{model: (blocks [L_m], scores [L_m])}``; the models may have different numbers of blocks.
        randoms: ``{model: random-chance score}`` (models left out, or with a score that is not finite, get none).
        metric: y-axis label; title: figure title; out_path_stem: output path without extension.

    Returns:
        ``[<stem>.png, <stem>.svg]``.
    """
    scores = {m: torch.as_tensor(v).detach().cpu().double().numpy() for m, (_, v) in curves.items()}
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    for model, (blocks, _) in curves.items():
        line = ax.plot(np.asarray(blocks), scores[model], marker="o", markersize=3, label=model)[0]
        random = randoms.get(model)
        if random is not None and np.isfinite(random):
            ax.axhline(random, linestyle="--", linewidth=1, color=line.get_color(), label=f"{model}: random chance")
    ax.set_xlabel("block")
    ax.set_ylabel(metric)
    ylim = quantity_range(metric) or PROBE_RANGE
    ax.set_ylim(*ylim)
    legend_note(ax, list(scores.values()) + list(randoms.values()))
    ax.set_title(textwrap.fill(title, width=70), fontsize=10)
    ax.grid(alpha=0.3)
    if curves:
        outside_legend(ax, fontsize=8)
    return save_figure(fig, out_path_stem, layout=True)
