"""The SAE benchmark's figure: the held-out AUROC of every method's best unit for every concept, one panel per model
(matplotlib object API only)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from vitscope.errors import VitscopeValueError
from vitscope.viz.save import save_figure

__all__ = ["concept_auroc_figure"]


def concept_auroc_figure(aurocs: Mapping[str, np.ndarray], concepts: Sequence[str], methods: Sequence[str],
                         stem: str | Path, floor: float = 0.5) -> list[Path]:
    """Heatmaps of AUROC, concepts down and methods across, one panel per model (concepts not scored in grey).

    Args:
        aurocs: ``{model: [C, M]}`` held-out AUROC of the best unit (NaN: not scored).
        concepts: the ``C`` row labels; methods: the ``M`` column labels.
        stem: output path without suffix.
        floor: the bottom of the colour scale (chance).

    Returns:
        ``[<stem>.png, <stem>.svg]``.
    """
    if not aurocs:
        raise VitscopeValueError("concept_auroc_figure needs at least one model")
    for model, table in aurocs.items():
        if np.shape(table) != (len(concepts), len(methods)):
            raise VitscopeValueError(f"{model}: expected a [{len(concepts)}, {len(methods)}] table, got "
                                     f"{np.shape(table)}")
    n = len(aurocs)
    fig = Figure(figsize=(1.6 + 0.42 * len(methods) * n + 0.6, 1.4 + 0.14 * len(concepts)), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, n, sharey=True))
    image = None
    for ax, (model, table) in zip(axes, aurocs.items()):
        shown = np.ma.masked_invalid(np.asarray(table, dtype=np.float64))
        image = ax.imshow(shown, vmin=floor, vmax=1.0, cmap="viridis", aspect="auto", interpolation="nearest")
        ax.set_facecolor("0.85")
        ax.set_xticks(range(len(methods)), list(methods), rotation=90, fontsize=7)
        ax.set_yticks(range(len(concepts)), list(concepts), fontsize=6)
        ax.set_title(model, fontsize=8)
    if image is not None:
        bar = fig.colorbar(image, ax=list(axes), shrink=0.5)
        bar.set_label("held-out AUROC of the best unit", fontsize=7)
        bar.ax.tick_params(labelsize=6)
    return save_figure(fig, stem)
