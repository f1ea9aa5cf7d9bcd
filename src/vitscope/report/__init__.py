"""``report.html``: one self-contained page per run (summary, a section per analysis, explorer, numbers)."""

from vitscope.report.build import build_report
from vitscope.report.explorer import explorer_from_maps
from vitscope.report.model import Explorer, ExplorerGrid, FigureItem, Report, Section, Table
from vitscope.report.render import data_uri, render_html
from vitscope.report.sections import explorer_of, summary_rows

__all__ = [
    "Explorer",
    "ExplorerGrid",
    "FigureItem",
    "Report",
    "Section",
    "Table",
    "build_report",
    "data_uri",
    "explorer_from_maps",
    "explorer_of",
    "render_html",
    "summary_rows",
]
