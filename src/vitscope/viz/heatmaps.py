"""Block x head heatmaps (matplotlib object API only: no pyplot, no global backend switch).

``matplotlib.figure.Figure`` renders straight to files with its own canvas, so these helpers work
headless and never touch the backend of an interactive session (no ``matplotlib.use`` call).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure

from vitscope.errors import VitscopeValueError
from vitscope.viz.ranges import bar_label
from vitscope.viz.save import save_figure

__all__ = ["block_head_heatmap"]

_MAX_TICKS = 24


def _as_matrix(matrix: torch.Tensor | np.ndarray) -> np.ndarray:
    arr = matrix.detach().cpu().double().numpy() if isinstance(matrix, torch.Tensor) else np.asarray(matrix)
    if arr.ndim != 2:
        raise VitscopeValueError(f"block_head_heatmap expects a [L, H] matrix, got shape {tuple(arr.shape)}")
    return arr.astype(np.float64)


def _ticks(count: int) -> np.ndarray:
    step = max(1, int(np.ceil(count / _MAX_TICKS)))
    return np.arange(0, count, step)


def block_head_heatmap(
    matrix: torch.Tensor | np.ndarray,
    title: str,
    colorbar_label: str,
    out_path_stem: str | Path,
    block_labels: Sequence[int | str] | None = None,
    cmap: str = "viridis",
    x_label: str = "head",
    y_label: str = "block",
    value_range: tuple[float, float] | None = None,
) -> list[Path]:
    """Draw a blocks x heads heatmap and write it as ``<stem>.png`` and ``<stem>.svg``.

    Blocks are on the y-axis with block 0 at the top, heads on the x-axis; NaN cells are blank.

    Args:
        matrix: ``[L, H]`` values (tensor or array), row = block, column = head.
        title: figure title.
        colorbar_label: label of the colour bar (quantity and unit).
        out_path_stem: output path without extension; parent folders are created.
        block_labels: optional label of each row (e.g. the actual block indices); default ``0..L-1``.
        cmap: matplotlib colour map name.
        x_label, y_label: axis titles (other matrices than blocks x heads reuse this figure).
        value_range: fixed ``(min, max)`` of the colour scale (a bounded quantity's range,
            :func:`vitscope.viz.ranges.quantity_range`); the colour bar then notes the data's own range. None:
            the data's range.

    Returns:
        ``[<stem>.png, <stem>.svg]`` (the SVG only for up to :data:`~vitscope.viz.save.RASTER_PIXELS` cells).
    """
    arr = _as_matrix(matrix)
    num_blocks, num_heads = arr.shape
    labels = list(block_labels) if block_labels is not None else list(range(num_blocks))
    if len(labels) != num_blocks:
        raise VitscopeValueError(f"block_labels has {len(labels)} entries for {num_blocks} blocks")

    width = min(14.0, max(5.0, 2.6 + 0.45 * num_heads))
    height = min(14.0, max(3.2, 1.6 + 0.35 * num_blocks))
    fig = Figure(figsize=(width, height))
    ax = fig.add_subplot()
    vmin, vmax = value_range if value_range is not None else (None, None)
    image = ax.imshow(arr, aspect="auto", origin="upper", cmap=cmap, interpolation="nearest", vmin=vmin, vmax=vmax)
    xt, yt = _ticks(num_heads), _ticks(num_blocks)
    ax.set_xticks(xt, [str(i) for i in xt])
    ax.set_yticks(yt, [str(labels[i]) for i in yt])
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.set_title(textwrap.fill(title, width=int(width * 8)), fontsize=10)
    fig.colorbar(image, ax=ax, label=bar_label(colorbar_label, arr) if value_range is not None else colorbar_label)
    return save_figure(fig, out_path_stem, layout=True)
