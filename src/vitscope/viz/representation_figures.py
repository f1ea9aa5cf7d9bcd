"""Figures of the representation analyses (paper 002 figures 6, 7, 8, 19 to 27), PNG and SVG.

matplotlib object API only (no pyplot, no backend switch), as :mod:`vitscope.viz.heatmaps`.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure

from vitscope.errors import VitscopeValueError
from vitscope.viz.ranges import bar_label, legend_note
from vitscope.viz.save import outside_legend, save_figure

__all__ = ["cka_heatmap", "curves_figure", "residual_figure"]

_MAX_TICKS = 24


def _array(x: torch.Tensor | np.ndarray | Sequence[float]) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def _ticks(labels: Sequence[str]) -> np.ndarray:
    step = max(1, int(np.ceil(len(labels) / _MAX_TICKS)))
    return np.arange(0, len(labels), step)


def cka_heatmap(
    matrix: torch.Tensor | np.ndarray,
    title: str,
    out_path_stem: str | Path,
    row_labels: Sequence[str | int] | None = None,
    col_labels: Sequence[str | int] | None = None,
    row_title: str = "block",
    col_title: str = "block",
    annotate: bool | None = None,
) -> list[Path]:
    """CKA matrix as a heatmap on a fixed [0, 1] colour scale (block x block, or model x model).

    Row 0 is at the bottom (as the paper's depth-wise CKA plots); NaN cells are blank.

    Args:
        matrix: ``[R, C]`` CKA values.
        title: figure title.
        out_path_stem: output path without extension.
        row_labels: label of each row (default ``0..R-1``); col_labels likewise.
        row_title: y-axis title; col_title: x-axis title.
        annotate: print the values in the cells (default: when the matrix has at most 12 x 12 cells).

    Returns:
        ``[<stem>.png, <stem>.svg]``.
    """
    arr = _array(matrix)
    if arr.ndim != 2:
        raise VitscopeValueError(f"cka_heatmap expects an [R, C] matrix, got shape {arr.shape}")
    rows = [str(v) for v in (row_labels if row_labels is not None else range(arr.shape[0]))]
    cols = [str(v) for v in (col_labels if col_labels is not None else range(arr.shape[1]))]
    if len(rows) != arr.shape[0] or len(cols) != arr.shape[1]:
        raise VitscopeValueError(f"labels ({len(rows)}, {len(cols)}) do not match the matrix shape {arr.shape}")
    size = min(12.0, max(4.5, 2.0 + 0.38 * max(arr.shape)))
    fig = Figure(figsize=(size + 1.2, size))
    ax = fig.add_subplot()
    image = ax.imshow(arr, origin="lower", cmap="magma", vmin=0.0, vmax=1.0, interpolation="nearest")
    xt, yt = _ticks(cols), _ticks(rows)
    ax.set_xticks(xt, [cols[i] for i in xt], rotation=45 if max(map(len, cols)) > 3 else 0, ha="right"
                  if max(map(len, cols)) > 3 else "center")
    ax.set_yticks(yt, [rows[i] for i in yt])
    ax.set_xlabel(col_title)
    ax.set_ylabel(row_title)
    ax.set_title(textwrap.fill(title, width=int(size * 9)), fontsize=10)
    if annotate if annotate is not None else max(arr.shape) <= 12:
        for r in range(arr.shape[0]):
            for c in range(arr.shape[1]):
                if np.isfinite(arr[r, c]):
                    ax.text(c, r, f"{arr[r, c]:.2f}", ha="center", va="center", fontsize=7,
                            color="black" if arr[r, c] > 0.6 else "white")
    fig.colorbar(image, ax=ax, label=bar_label("CKA", arr))
    return save_figure(fig, out_path_stem, layout=True)


def curves_figure(
    curves: Mapping[str, torch.Tensor | np.ndarray | Sequence[float]],
    title: str,
    ylabel: str,
    out_path_stem: str | Path,
    baselines: Mapping[str, float] | None = None,
    xlabel: str = "block",
    x_values: Sequence[int] | None = None,
    ylim: tuple[float, float] | None = None,
) -> list[Path]:
    """One line per named curve over blocks, dashed horizontal lines for baselines (e.g. random chance).

    Args:
        curves: ``{label: [L] values}`` (NaN points are left out).
        title: figure title; ylabel: y-axis label; xlabel: x-axis label.
        out_path_stem: output path without extension.
        baselines: ``{label: value}`` drawn as dashed horizontal lines.
        x_values: x position of each point (default ``0..L-1``, block numbers).
        ylim: y-axis range (default: automatic); with both ends given (a bounded quantity), the legend notes
            the data's own range.

    Returns:
        ``[<stem>.png, <stem>.svg]``.
    """
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    for label, values in curves.items():
        y = _array(values)
        x = np.asarray(x_values if x_values is not None else np.arange(len(y)))
        ax.plot(x, y, marker="o", markersize=3, label=label)
    for k, (label, value) in enumerate((baselines or {}).items()):
        if value is not None and np.isfinite(value):
            ax.axhline(float(value), linestyle="--", linewidth=1, color=f"C{(len(curves) + k) % 10}", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if ylim is not None:
        ax.set_ylim(*ylim)
        if None not in ylim:
            legend_note(ax, [_array(v) for v in curves.values()] + [v for v in (baselines or {}).values()])
    ax.set_title(textwrap.fill(title, width=70), fontsize=10)
    ax.grid(alpha=0.3)
    if curves or baselines:
        outside_legend(ax, fontsize=8)
    return save_figure(fig, out_path_stem, layout=True)


def residual_figure(
    attn_cka: torch.Tensor | np.ndarray,
    mlp_cka: torch.Tensor | np.ndarray,
    attn_ratio: torch.Tensor | np.ndarray,
    mlp_ratio: torch.Tensor | np.ndarray,
    title: str,
    out_path_stem: str | Path,
) -> list[Path]:
    """Residual-path curves (paper 002 figure 23 and its norm ratio): CKA(skip, branch) and ||skip|| / ||branch||.

    Args:
        attn_cka: ``[L]`` CKA between each attention sublayer's skip input and its branch output.
        mlp_cka: ``[L]`` the same for the MLP sublayers.
        attn_ratio: ``[L]`` mean ``||skip||_F / ||branch||_F`` of the attention sublayers; mlp_ratio likewise.
        title: figure title; out_path_stem: output path without extension.

    Returns:
        ``[<stem>.png, <stem>.svg]``.
    """
    fig = Figure(figsize=(10.0, 4.0))
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for ax, (a, m), ylabel in ((left, (attn_cka, mlp_cka), "CKA(skip input, branch output)"),
                               (right, (attn_ratio, mlp_ratio), "mean ||skip||_F / ||branch||_F")):
        ax.plot(np.arange(len(_array(a))), _array(a), marker="o", markersize=3, label="attention")
        ax.plot(np.arange(len(_array(m))), _array(m), marker="s", markersize=3, label="MLP")
        ax.set_xlabel("block")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax is left:  # CKA on its range
            legend_note(ax, [_array(a), _array(m)])
        outside_legend(ax, fontsize=8)
    left.set_ylim(0.0, 1.05)
    ratios = np.concatenate([_array(attn_ratio), _array(mlp_ratio)])
    if np.isfinite(ratios).any() and (ratios[np.isfinite(ratios)] > 0).all():  # log axis only for positive ratios
        right.set_yscale("log")
    fig.suptitle(textwrap.fill(title, width=110), fontsize=10)
    return save_figure(fig, out_path_stem, layout=True)
