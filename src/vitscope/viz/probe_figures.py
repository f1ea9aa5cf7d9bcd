"""Probe curves per block (paper 002 figures 9, 10 and 28 to 31) and clustering curves (7, 8, 24 to 27)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from vitscope.viz.ranges import PROBE_RANGE, quantity_range
from vitscope.viz.representation_figures import curves_figure

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
        first = next(iter(per_model.values()))
        for metric in first.meta.get("metrics", []):
            curves = {m: r.tensors[metric] for m, r in per_model.items() if metric in r.tensors}
            if not curves:
                continue
            random = first.tensors.get(f"random_{metric}")
            stem = Path(out_dir) / f"compare_{task}_{metric.replace('@', '_at_').replace('&', 'and')}"
            paths += probe_curves(curves, metric, f"{task}: {metric} per block", stem,
                                  random=None if random is None else float(random), blocks=first.meta.get("blocks"))
    return paths
