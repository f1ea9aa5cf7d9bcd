"""Charts as data: what a curve or heat-map figure shows, drawn by the browser in the report.

A :class:`Chart` holds the numbers of a figure and how to read them (axes, units, which curve is a baseline
of which model), nothing about pixels. The report renders it interactively (hover shows values, a legend
click hides a model, log/linear where it helps, PNG and SVG downloads); the output folder keeps it as
``charts/<stem>.json``; ``--figure-files`` draws the figure's matplotlib files as well. Writing a chart costs
microseconds, where drawing it with matplotlib cost 0.2-0.5 s.

Colours are not chosen here: every curve names its ``model`` and the report gives each model one colour
on the whole page.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from vitscope.errors import VitscopeValueError
from vitscope.viz.ranges import data_range, range_note

__all__ = ["Band", "Chart", "Curve", "HeatPanel", "LinePanel", "block_head_chart", "block_lines_chart", "curve",
           "depth_lines_chart", "tick_names", "value_lines_chart"]

#: colour maps a heat map may use (the report knows their colours)
HEAT_COLOURS = ("viridis", "inferno", "diverging")
#: how a curve is drawn: lines (solid with markers, dashed, dotted), points, or bars (filled, hatched)
STYLES = ("line", "dashed", "dotted", "dots", "bars", "hatched_bars")


def _values(x: torch.Tensor | np.ndarray | Sequence[float]) -> list[float | None]:
    """Plain floats for JSON (NaN and infinities become None: a gap in a curve, a blank cell)."""
    arr = x.detach().cpu().double().reshape(-1).tolist() if isinstance(x, torch.Tensor) else \
        np.asarray(x, dtype=np.float64).reshape(-1).tolist()
    return [v if math.isfinite(v) else None for v in arr]


@dataclass
class Curve:
    """One series of a line panel.

    Attributes:
        name: legend entry. Curves with the same name share one legend entry (a model and its own baseline).
        values: one value per x tick (None: no value).
        colour: colour key: curves with the same key share one colour on the whole page (usually a model's
            name, so a model keeps its colour in every figure); "" is a neutral grey (a shared baseline).
        style: one of :data:`STYLES`: ``"line"`` (solid, with markers), ``"dashed"``, ``"dotted"``, ``"dots"``
            (points without a line; ``values`` may then hold several values per tick, e.g. one per head),
            ``"bars"`` or ``"hatched_bars"`` (one bar per tick, side by side with the panel's other bars).
        x: the x of every value on a numeric axis (``LinePanel.x_kind == "value"``); None on a category axis.
        baseline: a reference to read the other curves against (random chance, the unmasked accuracy): drawn
            thin without markers, and its hover value says "(baseline)". None: a dashed curve is a baseline.
    """

    name: str
    values: list[float | None] | list[list[float | None]]
    colour: str = ""
    style: Literal["line", "dashed", "dotted", "dots", "bars", "hatched_bars"] = "line"
    x: list[float] | None = None
    baseline: bool | None = None

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise VitscopeValueError(f"curve style {self.style!r}: use one of {', '.join(STYLES)}")
        if self.baseline is None:
            self.baseline = self.style == "dashed"


@dataclass
class Band:
    """A shaded stretch of a category axis with its name above it (e.g. a stage over blocks ``first..last``)."""

    name: str
    first: str
    last: str


@dataclass
class LinePanel:
    """Curves over one axis: categories (``x_ticks``, usually blocks) or numbers (``x_kind="value"``: every
    curve gives its ``x``, e.g. relative depth).

    ``y_range``: fixed ``(min, max)`` of the value axis, either end None for automatic; a bounded quantity gets
    its documented range (:func:`vitscope.viz.ranges.quantity_range`). With both ends fixed, ``data_range`` is the
    ``(min, max)`` of the values and ``range_note`` says it (``"data 0.886–1.000"``, shown in the legend).
    """

    x_label: str
    y_label: str
    x_ticks: list[str]
    curves: list[Curve]
    title: str = ""
    y_range: tuple[float | None, float | None] = (None, None)
    log_toggle: bool = False
    x_kind: Literal["category", "value"] = "category"
    x_range: tuple[float | None, float | None] = (None, None)
    bands: list[Band] = field(default_factory=list)
    kind: str = field(default="lines", init=False)
    data_range: tuple[float, float] | None = field(default=None, init=False)
    range_note: str = field(default="", init=False)

    def __post_init__(self) -> None:
        if self.x_kind == "value" and any(c.x is None or len(c.x) != len(c.values) for c in self.curves):
            raise VitscopeValueError("on a numeric x axis every curve needs one x per value")
        if self.x_kind == "value" and any(c.style in ("bars", "hatched_bars") for c in self.curves):
            raise VitscopeValueError("bars need a category x axis")
        unknown = {t for b in self.bands for t in (b.first, b.last)} - set(self.x_ticks)
        if unknown:
            raise VitscopeValueError(f"bands over ticks {sorted(unknown)} that the axis does not have")
        if self.bands and any(c.style in ("bars", "hatched_bars") for c in self.curves):
            raise VitscopeValueError("a panel with bands cannot also have bars (the bands are drawn as bars)")
        if self.bands:  # bands are bars from the axis' foot: a log axis has none
            self.log_toggle = False
        if None not in self.y_range:  # a fixed scale: say where the data lie on it
            self.data_range = data_range([c.values for c in self.curves])
            self.range_note = range_note(self.data_range)


@dataclass
class HeatPanel:
    """A matrix of values (rows x columns), e.g. blocks x heads, with a colour scale.

    ``colours``: one of :data:`HEAT_COLOURS` (``"diverging"`` centres the scale on 0). ``value_range``: a fixed
    ``(min, max)`` of the colour scale (a bounded quantity's documented range,
    :func:`vitscope.viz.ranges.quantity_range`, e.g. ``(0, 1)`` for CKA); None: the values' own range. With a fixed
    range, ``data_range`` is the ``(min, max)`` of the values and ``range_note`` says it beside the colour bar.
    """

    x_label: str
    y_label: str
    value_label: str
    rows: list[str]
    columns: list[str]
    values: list[list[float | None]]
    title: str = ""
    colours: str = "viridis"
    value_range: tuple[float, float] | None = None
    kind: str = field(default="heatmap", init=False)
    data_range: tuple[float, float] | None = field(default=None, init=False)
    range_note: str = field(default="", init=False)

    def __post_init__(self) -> None:
        if self.colours not in HEAT_COLOURS:
            raise VitscopeValueError(f"heat map colours {self.colours!r}: use one of {', '.join(HEAT_COLOURS)}")
        if len(self.values) != len(self.rows) or any(len(r) != len(self.columns) for r in self.values):
            raise VitscopeValueError(f"heat map of {len(self.rows)} x {len(self.columns)} labels got values of "
                                     "another shape")
        if self.value_range is not None:  # a fixed scale: say where the data lie on it
            self.data_range = data_range(self.values)
            self.range_note = range_note(self.data_range)


@dataclass
class Chart:
    """A figure for the browser: one or more panels side by side."""

    panels: list[LinePanel | HeatPanel]

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (the report embeds it; ``charts/<stem>.json`` holds it)."""
        return {"panels": [asdict(p) for p in self.panels]}

    def colour_keys(self) -> list[str]:
        """Colour keys of the curves, in order of first appearance."""
        seen: dict[str, None] = {}
        for p in self.panels:
            for c in getattr(p, "curves", []):
                if c.colour:
                    seen.setdefault(c.colour, None)
        return list(seen)


def tick_names(count: int, labels: Sequence | None) -> list[str]:
    """``count`` axis tick names: ``labels`` as text (one each), or ``0 .. count-1``."""
    labels = list(labels) if labels is not None else list(range(count))
    if len(labels) != count:
        raise VitscopeValueError(f"{len(labels)} labels for {count} rows")
    return [str(v) for v in labels]


def block_head_chart(matrix: torch.Tensor | np.ndarray, value_label: str, block_labels: Sequence | None = None,
                     title: str = "", colours: str = "viridis", x_label: str = "head", y_label: str = "block",
                     column_labels: Sequence | None = None, value_range: tuple[float, float] | None = None) -> Chart:
    """A blocks x heads heat map (the browser twin of :func:`vitscope.viz.heatmaps.block_head_heatmap`).

    Args:
        matrix: ``[L, H]`` values (NaN and infinities become blank cells).
        value_label: what a cell holds, with its unit (shown on hover).
        block_labels, column_labels: row and column names (default ``0..L-1`` and ``0..H-1``).
        title: panel title.
        colours: one of :data:`HEAT_COLOURS`.
        x_label, y_label: axis names.
        value_range: fixed ``(min, max)`` of the colour scale, e.g. ``quantity_range("cka")`` (None: the values'
            range); the panel then notes the values' own range.
    """
    arr = matrix.detach().cpu().double().numpy() if isinstance(matrix, torch.Tensor) else np.asarray(matrix, float)
    if arr.ndim != 2:
        raise VitscopeValueError(f"expected a [L, H] matrix, got shape {tuple(arr.shape)}")
    rows = tick_names(arr.shape[0], block_labels)
    columns = tick_names(arr.shape[1], column_labels)
    values = [_values(r) for r in arr]
    return Chart([HeatPanel(x_label, y_label, value_label, rows, columns, values, title, colours, value_range)])


def block_lines_chart(curves: Sequence[Curve], y_label: str, length: int, block_labels: Sequence | None = None,
                      title: str = "", y_range: tuple[float | None, float | None] = (None, None),
                      bands: Sequence[Band] = (), x_label: str = "block") -> Chart:
    """Curves over ``length`` blocks in one panel; a log/linear toggle when every value is positive.

    Args:
        curves: the series (a model's curve and its dashed baseline share a name and a colour key).
        y_label: the value axis name, with its unit.
        length: number of blocks (x ticks).
        block_labels: tick labels (default ``0..length-1``).
        title: panel title.
        y_range: fixed ``(min, max)`` of the value axis (None: automatic).
        bands: shaded stretches of blocks (e.g. stages), by tick name.
        x_label: the block axis name.
    """
    positive = all(v is None or v > 0 for c in curves for v in _flat(c.values))
    return Chart([LinePanel(x_label, y_label, tick_names(length, block_labels), list(curves), title, y_range,
                            log_toggle=positive, bands=list(bands))])


def depth_lines_chart(curves: Sequence[Curve], y_label: str, title: str = "",
                      y_range: tuple[float | None, float | None] = (None, None)) -> Chart:
    """Curves over relative depth ``b / (L - 1)`` (models of different depth on one axis).

    Args:
        curves: the series; every one gives ``x`` (its blocks' relative depths).
        y_label: the value axis name, with its unit.
        title: panel title.
        y_range: fixed ``(min, max)`` of the value axis (None: automatic).
    """
    positive = all(v is None or v > 0 for c in curves for v in _flat(c.values))
    return Chart([LinePanel("relative depth (block / (blocks - 1))", y_label, [], list(curves), title, y_range,
                            log_toggle=positive, x_kind="value", x_range=(0.0, 1.0))])


def value_lines_chart(curves: Sequence[Curve], x_label: str, y_label: str, title: str = "",
                      x_range: tuple[float | None, float | None] = (None, None),
                      y_range: tuple[float | None, float | None] = (None, None)) -> Chart:
    """Curves over a numeric axis in one panel (a mask ratio, a cut-off radius, epochs); every curve gives ``x``.

    Args:
        curves: the series, each with ``x``.
        x_label, y_label: axis names, with units.
        title: panel title.
        x_range, y_range: fixed ``(min, max)`` of each axis (None: automatic).
    """
    positive = all(v is None or v > 0 for c in curves for v in _flat(c.values))
    return Chart([LinePanel(x_label, y_label, [], list(curves), title, y_range, log_toggle=positive,
                            x_kind="value", x_range=x_range)])


def _flat(values: list) -> list:
    return [v for item in values for v in (item if isinstance(item, list) else [item])]


def curve(name: str, values: torch.Tensor | np.ndarray | Sequence[float], colour: str = "",
          style: Literal["line", "dashed", "dotted", "dots", "bars", "hatched_bars"] = "line",
          x: torch.Tensor | np.ndarray | Sequence[float] | None = None, baseline: bool | None = None) -> Curve:
    """A :class:`Curve` from a tensor or array.

    Args:
        name: legend entry.
        values: ``[X]`` values, or ``[X, k]`` with ``style="dots"`` (k values per tick, e.g. one per head).
        colour: colour key (usually the model's name; "" for neutral grey).
        style: one of :data:`STYLES`.
        x: ``[X]`` positions on a numeric axis (None on a category axis).
        baseline: whether the curve is a reference line (None: when dashed).
    """
    xs = None if x is None else [float(v) for v in _values(x)]
    if style == "dots":
        arr = values.detach().cpu().double().numpy() if isinstance(values, torch.Tensor) else np.asarray(values, float)
        if arr.ndim == 2:
            return Curve(name, [_values(row) for row in arr], colour, style, xs, baseline)
    return Curve(name, _values(values), colour, style, xs, baseline)
