"""Figures of the masking and robustness analyses (paper 003 figure 8, paper 001 tables 2-3, Fourier sweeps).

Every function takes one entry per model (``{model name: data}``), so the same figure shows a ViT beside a
CNN when several models ran; it writes ``<stem>.png`` and ``<stem>.svg`` and returns both paths.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure

from vitscope.viz.attention_maps import as_numpy as _np
from vitscope.viz.ranges import legend_note
from vitscope.viz.save import outside_legend, save_figure

__all__ = ["foreground_bars_figure", "frequency_figure", "guided_mae_figure", "ratio_curves_figure"]

_STYLE = {"top": "-", "bottom": "--", "random": ":", "low": "-", "high": "--"}


def _colours(names: Sequence[str]) -> dict[str, str]:
    return {n: f"C{i % 10}" for i, n in enumerate(names)}


def ratio_curves_figure(curves: Mapping[str, Mapping[str, torch.Tensor]], ratios: Sequence[float],
                        full: Mapping[str, float], title: str, stem: str | Path) -> list[Path]:
    """Figure 8: accuracy against the mask ratio, one line per model and masking order.

    Args:
        curves: model -> order (``"top"``, ``"bottom"``, ``"random"``) -> ``[R]`` accuracy.
        ratios: the R mask ratios.
        full: model -> unmasked accuracy (dotted horizontal line).
        title: figure title.
        stem: output path without suffix.
    """
    colours = _colours(list(curves))
    x = 100 * np.asarray(ratios, dtype=float)
    fig = Figure(figsize=(5.8, 3.6), layout="constrained")
    ax = fig.subplots()
    for model, per_order in curves.items():
        for order, acc in per_order.items():
            ax.plot(x, _np(acc), ls=_STYLE.get(order, "-"), marker="o", ms=3, color=colours[model],
                    label=f"{model}: {order}" if len(curves) > 1 else order)
        if model in full:
            ax.axhline(full[model], color=colours[model], lw=0.8, alpha=0.5)
    ax.set_xlabel("masked patches (%)")
    ax.set_ylabel("top-1 accuracy")
    ax.set_ylim(0, 1.02)
    legend_note(ax, [_np(a) for per in curves.values() for a in per.values()] + list(full.values()))
    ax.set_title(title, fontsize=8)
    outside_legend(ax, fontsize=7)
    return save_figure(fig, stem)


def foreground_bars_figure(normalised: Mapping[str, torch.Tensor], topk: Sequence[int],
                           stem: str | Path) -> list[Path]:
    """Paper 001 tables 2-3 as bars: foreground-only and background-only accuracy / full accuracy per model.

    Args:
        normalised: model -> ``[3, len(topk)]`` normalised accuracy (rows: full, foreground, background).
        topk: the k of each column.
    """
    models = list(normalised)
    fig = Figure(figsize=(2.2 + 1.6 * len(models) * len(topk), 3.4), layout="constrained")
    ax = fig.subplots()
    groups = [(m, j) for m in models for j in range(len(topk))]
    x = np.arange(len(groups))
    width = 0.38
    fg = [_np(normalised[m])[1, j] for m, j in groups]
    bg = [_np(normalised[m])[2, j] for m, j in groups]
    ax.bar(x - width / 2, fg, width, label="foreground only", color="tab:blue")
    ax.bar(x + width / 2, bg, width, label="background only", color="tab:orange")
    ax.axhline(1.0, color="black", lw=0.8, ls=":")
    ax.set_xticks(x, [f"{m}\ntop-{topk[j]}" for m, j in groups], fontsize=7)
    ax.set_ylabel("accuracy / full-image accuracy")
    ax.set_title("Foreground and background reliance (normalised by full-image accuracy)", fontsize=8)
    outside_legend(ax, fontsize=7)
    return save_figure(fig, stem)


def frequency_figure(accuracy: Mapping[str, torch.Tensor], fractions: Sequence[float], full: Mapping[str, float],
                     stem: str | Path) -> list[Path]:
    """Accuracy against the Fourier cut-off radius, low-pass (solid) and high-pass (dashed), one colour per model.

    Args:
        accuracy: model -> ``[2, R]`` (low, high).
        fractions: cut-off radii as fractions of ``min(H, W) / 2``.
        full: model -> unfiltered accuracy (thin horizontal line).
    """
    colours = _colours(list(accuracy))
    fig = Figure(figsize=(5.8, 3.6), layout="constrained")
    ax = fig.subplots()
    for model, acc in accuracy.items():
        arr = _np(acc)
        for i, kind in enumerate(("low", "high")):
            ax.plot(fractions, arr[i], ls=_STYLE[kind], marker="o", ms=3, color=colours[model],
                    label=f"{model}: {kind}-pass")
        if model in full:
            ax.axhline(full[model], color=colours[model], lw=0.8, alpha=0.5)
    ax.set_xlabel("cut-off radius / (min(H, W) / 2)")
    ax.set_ylabel("top-1 accuracy")
    ax.set_ylim(0, 1.02)
    legend_note(ax, [_np(a) for a in accuracy.values()] + list(full.values()))
    ax.set_title("Fourier filtering: low-pass keeps frequencies within the radius, high-pass beyond it", fontsize=8)
    outside_legend(ax, fontsize=7)
    return save_figure(fig, stem)


def guided_mae_figure(epochs: Sequence[float], curves: Mapping[str, Sequence[float]], ylabel: str,
                      stem: str | Path, rho: tuple[Sequence[float], Sequence[float]] | None = None) -> list[Path]:
    """Figure 9: probe accuracy against training epochs for random-mask and guided-mask pretraining.

    Args:
        epochs: evaluation points (epochs, fractional allowed).
        curves: twin name -> accuracy at each point.
        ylabel: what the accuracy is (e.g. "k-NN accuracy").
        rho: the guided twin's keypoint share over training (second axis), if given: ``(epochs, values)``
            joined by straight lines, the vertices of its staircase
            (:func:`~vitscope.experiments.guided_mae.rho_staircase`).
    """
    fig = Figure(figsize=(5.8, 3.6), layout="constrained")
    ax = fig.subplots()
    for name, acc in curves.items():
        ax.plot(epochs, acc, marker="o", ms=3, label=name)
    ax.set_xlabel("epoch")
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 1.02)  # an accuracy, on its range
    legend_note(ax, [list(v) for v in curves.values()])
    ax.set_title("MAE pretraining: random vs guided (SIFT keypoint) masking", fontsize=9)
    if rho is not None:
        twin = ax.twinx()
        twin.plot(*rho, color="gray", ls=":", label="rho (guided)")
        twin.set_ylabel("rho")
        twin.set_ylim(-0.05, 1.05)
    outside_legend(ax, fontsize=7)
    return save_figure(fig, stem)
