"""Figures of a sparse autoencoder's latents: feature cards (top patches, the direction's feature visualisation, class
and region histograms) and the histogram of firing frequencies."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure

from vitscope.viz.save import save_figure

__all__ = ["feature_cards", "frequency_histogram"]

_BAR = (66, 99, 163)
_LABEL_W, _BAR_W, _BAR_ROW = 78, 70, 13
_HIST_W = _LABEL_W + _BAR_W
_SHOWN_BARS = 6


def _bars(canvas: Any, x: int, y: int, title: str, labels: Sequence[str], values: Sequence[float]) -> None:
    """A small horizontal bar chart of the largest ``values`` (at most :data:`_SHOWN_BARS`, largest first), each bar
    after its label."""
    canvas.text(x, y, title, size=10)
    order = sorted(range(len(values)), key=lambda i: (-values[i], i))[:_SHOWN_BARS]
    top = max([values[i] for i in order] + [0.0])
    for n, i in enumerate(order):
        row = y + 16 + n * _BAR_ROW
        canvas.text(x, row, labels[i], size=9)
        w = 0 if top <= 0 or not math.isfinite(values[i]) else max(1, round(_BAR_W * values[i] / top))
        if w:
            canvas.paste(np.full((_BAR_ROW - 3, w, 3), _BAR, dtype=np.uint8), x + _LABEL_W, row + 1)


def feature_cards(latents: Sequence[int], frequencies: Sequence[float], cells: Sequence[Mapping[str, Any]],
                  featviz: Mapping[int, torch.Tensor], histograms: Mapping[str, tuple[Sequence[str], torch.Tensor]],
                  hook: str, stem: str | Path, side: int = 80) -> list[Path]:
    """One card (row) per latent: its top images with its activation over their patches, the feature
    visualisation of its encoder direction (when given), and its mean activation per class and per region.

    Args:
        latents: the latent ids; frequencies: the share of tokens each fires on.
        cells: per latent ``{"maps": [[h, w]...], "scores": [...], "pictures": [[S, S, 3] uint8 or None...],
            "names": [file name or None...]}``, best image first.
        featviz: latent -> ``[S, S, 3]`` uint8 picture.
        histograms: ``"class"`` / ``"region"`` -> (labels, ``[C, L]`` mean activations).
        hook: in the title; stem: output path without suffix; side: pixels of each image.
    """
    from vitscope.viz.featviz_figures import map_cell
    from vitscope.viz.labels import short_name
    from vitscope.viz.raster import Canvas

    k = max([len(c["maps"]) for c in cells] + [1])
    label_w, row = 110, side + 40
    images_w = k * (side + 6)
    canvas = Canvas(label_w + images_w + side + 2 * (_HIST_W + 20) + 40, 40 + len(latents) * row)
    canvas.text(10, 8, f"SAE feature cards: {hook}", size=14)
    for r, (latent, freq, cell) in enumerate(zip(latents, frequencies, cells)):
        y = 34 + r * row
        canvas.text(10, y + side // 2 - 6, f"latent {latent}", size=12)
        canvas.text(10, y + side // 2 + 10, f"fires {100 * freq:.2g}%", size=10)
        for j, values in enumerate(cell["maps"]):
            x = label_w + j * (side + 6)
            canvas.text(x + side // 2, y, f"{float(cell['scores'][j]):.2f}", size=10, anchor="ma")
            canvas.paste(map_cell(values, cell["pictures"][j], side), x, y + 13)
            name = cell["names"][j]
            if name:
                canvas.text(x + side // 2, y + 15 + side, short_name(name, 12), size=9, anchor="ma")
        x = label_w + images_w + 6
        if int(latent) in featviz:
            from PIL import Image

            picture = Image.fromarray(np.asarray(featviz[int(latent)], dtype=np.uint8)).resize((side, side))
            canvas.text(x + side // 2, y, "direction", size=10, anchor="ma")
            canvas.paste(np.asarray(picture), x, y + 13)
        x += side + 20
        for key, (labels, means) in histograms.items():
            _bars(canvas, x, y, f"mean by {key}", labels, means[:, int(latent)].tolist())
            x += _HIST_W + 20
    canvas.colour_bar(label_w, 34 + len(latents) * row + 4, min(images_w, 300), "magma", "low", "high",
                      "the latent's code over the image's patches (each map on its own scale)")
    return canvas.save(stem)


def frequency_histogram(frequency: torch.Tensor, dense: float, stem: str | Path) -> list[Path]:
    """Histogram of ``log10`` firing frequencies ``[L]``; dead latents (never fired) counted in the title, the dense
    threshold drawn dashed."""
    f = frequency.double().cpu()
    dead = int((f <= 0).sum())
    alive = torch.log10(f[f > 0]).numpy()
    fig = Figure(figsize=(5.0, 3.0))
    ax = fig.add_subplot(1, 1, 1)
    if alive.size:
        ax.hist(alive, bins=min(50, max(5, alive.size // 4)), color="#4263a3")
    ax.axvline(math.log10(dense), color="#b03a2e", linestyle="dashed", label=f"dense above {dense:.0%}")
    ax.set_xlabel("log10 firing frequency")
    ax.set_ylabel("latents")
    ax.set_title(f"{len(f)} latents, {dead} never fired", fontsize=9)
    ax.legend(fontsize=8, frameon=False)
    return save_figure(fig, stem, dpi=110, svg=False, tight=True)
