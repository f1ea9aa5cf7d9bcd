"""Figures of ``vitscope compare``: one quantity per figure, every model on it, relative depth on the x axis."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from vitscope.viz.ranges import legend_note
from vitscope.viz.save import outside_legend, save_figure

__all__ = ["model_curves"]


def model_curves(
    curves: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    title: str,
    ylabel: str,
    out_path_stem: str | Path,
    baselines: Mapping[str, float] | None = None,
    baseline_label: str = "random",
    value_range: tuple[float, float] | None = None,
) -> list[Path]:
    """One line per model over relative depth (0 = first block, 1 = last), each model's baseline dashed.

    Args:
        curves: ``{model: (relative depths, values)}``.
        title, ylabel: figure title and y label; out_path_stem: output path without extension.
        baselines: ``{model: value}``: a horizontal dashed line in the model's colour (e.g. its random
            attention, which depends on its token grid), where finite.
        baseline_label: what the dashed lines are (in the legend).
        value_range: fixed ``(min, max)`` of the value axis (a bounded quantity's range); the legend then notes
            the data's own range. None: automatic.

    Returns:
        ``[<stem>.png, <stem>.svg]``.
    """
    fig = Figure(figsize=(6.8, 4.2))
    ax = fig.add_subplot()
    markers = "osD^v<>ph*"
    for k, (label, (x, y)) in enumerate(curves.items()):
        lap = k // 10  # past the ten colours of the cycle a model repeats a colour, with another marker and line
        line = ax.plot(np.asarray(x, dtype=float), np.asarray(y, dtype=float), marker=markers[(k + lap) % len(markers)],
                       markersize=4, linestyle=("-", "-.", ":")[lap % 3], label=label)[0]
        base = (baselines or {}).get(label)
        if base is not None and np.isfinite(base):
            ax.axhline(float(base), linestyle="--", linewidth=1, color=line.get_color(),
                       label=f"{label}: {baseline_label}")
    ax.set_xlabel("relative depth (block / (blocks - 1))")
    ax.set_ylabel(ylabel)
    ax.set_xlim(-0.03, 1.03)
    if value_range is not None:
        ax.set_ylim(*value_range)
        legend_note(ax, [y for _, y in curves.values()] + list((baselines or {}).values()))
    ax.set_title(textwrap.fill(title, width=70), fontsize=10)
    ax.grid(alpha=0.3)
    if curves:
        outside_legend(ax, fontsize=8)
    return save_figure(fig, out_path_stem)
