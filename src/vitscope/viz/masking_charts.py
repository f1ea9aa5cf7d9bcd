"""The masking and robustness figures as browser charts (twins of :mod:`vitscope.viz.masking_figures`).

Every function takes one entry per model (``{model name: data}``) so a ViT and a CNN share one chart; each
model keeps its page colour, and the line style tells the masking order or the filter apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from vitscope.viz.charts import Chart, LinePanel, curve, value_lines_chart

__all__ = ["foreground_chart", "frequency_chart", "ratio_chart"]

_ORDER_STYLE = {"top": "line", "bottom": "dashed", "random": "dotted", "low": "line", "high": "dashed"}


def _name(model: str, what: str, several: bool) -> str:
    return f"{model}: {what}" if several else what


def _full_line(model: str, value: float, x: Sequence[float], several: bool):
    """The unmasked accuracy as a thin reference line over the whole x range."""
    return curve(_name(model, "unmasked", several), [value, value], model, "line", [min(x), max(x)], baseline=True)


def ratio_chart(curves: Mapping[str, Mapping[str, torch.Tensor]], ratios: Sequence[float],
                full: Mapping[str, float], title: str) -> Chart:
    """Paper 003 figure 8: accuracy against the share of masked patches, one line per model and order.

    Args:
        curves: model -> order (``"top"``, ``"bottom"``, ``"random"``) -> ``[R]`` accuracy.
        ratios: the R mask ratios (fractions; shown in percent).
        full: model -> unmasked accuracy (a thin reference line).
        title: panel title.
    """
    x = [100.0 * float(r) for r in ratios]
    several = len(curves) > 1
    lines = []
    for model, per_order in curves.items():
        for order, acc in per_order.items():
            lines.append(curve(_name(model, f"{order} first", several), acc, model, _ORDER_STYLE.get(order, "line"),
                               x, baseline=False))
        if model in full:
            lines.append(_full_line(model, full[model], x, several))
    return value_lines_chart(lines, "masked patches (%)", "top-1 accuracy", title, (0.0, max(x)), (0.0, 1.0))


def frequency_chart(accuracy: Mapping[str, torch.Tensor], fractions: Sequence[float],
                    full: Mapping[str, float]) -> Chart:
    """Accuracy against the Fourier cut-off radius: low-pass solid, high-pass dashed, one colour per model.

    Args:
        accuracy: model -> ``[2, R]`` (rows: low-pass, high-pass).
        fractions: cut-off radii as fractions of ``min(H, W) / 2``.
        full: model -> unfiltered accuracy (a thin reference line).
    """
    x = [float(f) for f in fractions]
    several = len(accuracy) > 1
    lines = []
    for model, acc in accuracy.items():
        for i, kind in enumerate(("low", "high")):
            lines.append(curve(_name(model, f"{kind}-pass", several), acc[i], model, _ORDER_STYLE[kind], x,
                               baseline=False))
        if model in full:
            lines.append(_full_line(model, full[model], x, several))
    return value_lines_chart(lines, "cut-off radius / (min(H, W) / 2)", "top-1 accuracy",
                             "Low-pass keeps frequencies within the radius, high-pass beyond it", (0.0, max(x)),
                             (0.0, 1.0))


def foreground_chart(normalised: Mapping[str, torch.Tensor], topk: Sequence[int]) -> Chart:
    """Paper 001 tables 2-3 as bars: foreground-only (filled) and background-only (hatched) accuracy over the
    full-image accuracy, per top-k, one colour per model; 1 is the full image.

    Args:
        normalised: model -> ``[3, len(topk)]`` (rows: full, foreground only, background only).
        topk: the k of each column.
    """
    several = len(normalised) > 1
    bars = []
    for model, values in normalised.items():
        bars.append(curve(_name(model, "foreground only", several), values[1], model, "bars"))
        bars.append(curve(_name(model, "background only", several), values[2], model, "hatched_bars"))
    ticks = [f"top-{k}" for k in topk]
    bars.append(curve("full image", [1.0] * len(ticks), "", "dashed"))
    return Chart([LinePanel("top-k accuracy", "accuracy / full-image accuracy", ticks, bars,
                            "Foreground and background reliance")])
