"""What a report is made of: sections holding figures, tables and block x head explorers (plain data).

Builders (:mod:`~vitscope.report.sections`, the compare and demo workflows) fill these; the renderer
(:mod:`~vitscope.report.render`) turns them into one self-contained HTML file. Every string here may come
from the user (model ids, data paths, config values): the template escapes all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["SECTION_ID_PREFIX", "ExplorerGrid", "Explorer", "FigureItem", "Report", "Section", "Table", "figure_item"]


@dataclass
class FigureItem:
    """A figure of the report: a chart the browser draws, or a PNG embedded as it is.

    Attributes:
        path: the PNG file (read and embedded as a data URI when rendering), or None for a chart alone.
        title: short title; caption: what the figure shows and how to read it.
        paper: the paper figure it corresponds to (e.g. ``"paper 002, fig. 4"``), or "".
        chart: the chart's JSON (:meth:`vitscope.viz.charts.Chart.to_json`); shown instead of the PNG.
        stem: file stem, the name of the PNG and SVG a reader downloads from the chart.
    """

    path: Path | None
    title: str
    caption: str = ""
    paper: str = ""
    chart: dict[str, Any] | None = None
    stem: str = ""


def figure_item(figure: Any, png: Path | None) -> FigureItem:
    """The report item of a result's :class:`~vitscope.analyses.result.Figure` written as ``png`` (None: a chart
    that was not drawn)."""
    chart = figure.chart.to_json() if getattr(figure, "chart", None) is not None else None
    return FigureItem(png, figure.title, figure.caption, figure.paper, chart, figure.stem)


@dataclass
class Table:
    """A table of numbers: ``columns`` names and ``rows`` of cells (numbers are formatted when rendering);
    ``folded``: shown closed under its title (a matrix a heat map of the section already shows)."""

    title: str
    columns: list[str]
    rows: list[list[Any]]
    note: str = ""
    folded: bool = False


@dataclass
class ExplorerGrid:
    """One map source of an explorer (e.g. the dataset mean or one image).

    Attributes:
        label: button text, e.g. ``"dataset mean"`` or ``"image 3"``.
        cells: ``cells[b][h]`` PNG bytes of the map of block ``b``, head ``h`` (small; the browser scales it).
        ranges: ``ranges[b][h]`` ``(min, max)`` of the map before it was scaled to the colour map.
        image: PNG or JPEG bytes of the image the maps are drawn over in the enlarged view, or None.
    """

    label: str
    cells: list[list[bytes]]
    ranges: list[list[tuple[float, float]]]
    image: bytes | None = None


@dataclass
class Explorer:
    """A block x head grid of attention maps; pointing at a cell shows that head's map enlarged.

    ``grid_shape`` is the ``(h, w)`` token grid of the maps (sets the enlarged view's aspect ratio); ``bar`` the
    CSS gradient of the colour map, drawn as the enlarged map's colour bar.
    """

    title: str
    blocks: list[int]
    num_heads: int
    grids: list[ExplorerGrid]
    caption: str = ""
    paper: str = ""
    grid_shape: tuple[int, int] = (1, 1)
    bar: str = ""


@dataclass
class PairExplorer:
    """Retrieval with paired similarity maps: pick a query, see its top hits with both maps; toggle models and
    map kinds. ``data`` is the JSON the page's script reads (:func:`vitscope.report.pair_explorer.pair_explorer`
    builds it: thumbnails and maps as data URLs, names, classes, hits with scores)."""

    title: str
    data: dict[str, Any]
    caption: str = ""
    paper: str = ""


#: what every section's HTML id starts with: the page's own ids (``summary``, ``references``, ``paper-N``,
#: ``vs-...``) never do, so a section of any name (an analysis called ``summary``) cannot take one of them
SECTION_ID_PREFIX = "s-"


@dataclass
class Section:
    """One analysis (or one comparison quantity): text, figures, tables and explorers.

    ``id`` is the section's key (a slug, unique in its report); its element in the page is :attr:`anchor`.
    """

    id: str
    title: str
    intro: str = ""
    figures: list[FigureItem] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    explorers: list[Explorer] = field(default_factory=list)
    pair_explorers: list[PairExplorer] = field(default_factory=list)
    folded: bool = False  # nothing to look at beyond a few settings: shown closed
    figure_links: list[tuple[str, str]] = field(default_factory=list)  # (title, relative path) not embedded

    @property
    def anchor(self) -> str:
        """The section's HTML id, which the navigation links to (``s-`` and its :attr:`id`)."""
        return SECTION_ID_PREFIX + self.id


@dataclass
class Report:
    """The whole report.

    Attributes:
        title: page title; subtitle: one line under it.
        summary: ``(label, value)`` rows shown first (models, data, fingerprint, version...).
        config: the resolved configuration, shown as a table.
        sections: analysis sections in order.
        notes: warnings worth showing (skipped files...).
        colour_keys: the models (colour keys) in the order that gives each its colour in every chart.
    """

    title: str
    subtitle: str = ""
    summary: list[tuple[str, str]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    sections: list[Section] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    colour_keys: list[str] = field(default_factory=list)
