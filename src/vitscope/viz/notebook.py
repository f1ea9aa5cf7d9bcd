"""Result cards for Jupyter (``_repr_html_``): the title, the paragraph, the tables and the figures of a result,
as the report shows them, in one self-contained piece of HTML (figures as PNG data, nothing fetched)."""

from __future__ import annotations

import base64
import html
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["card_html", "cards_html"]

_STYLE = ("font-family: system-ui, sans-serif; border: 1px solid #d8dee6; border-radius: 6px; padding: .6rem .9rem; "
          "margin: .4rem 0; max-width: 980px")


def _png_of(figure: Any) -> str | None:
    """The figure drawn to PNG (charts with matplotlib), as a data URL; None when it draws no PNG."""
    with tempfile.TemporaryDirectory(prefix="vitscope-card-") as tmp:
        try:
            written = figure.draw(Path(tmp) / figure.stem)
        except Exception as err:  # a figure that cannot be drawn leaves the card readable, and says so
            return f"error:{type(err).__name__}: {err}"
        png = next((Path(p) for p in written if str(p).endswith(".png")), None)
        return None if png is None else "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()


def _table_html(title: str, frame: Any, max_rows: int) -> str:
    shown = frame.head(max_rows)
    body = shown.to_html(index=False, float_format=lambda v: f"{v:.4g}", border=0, escape=True)
    more = f"<p style='color:#667'>{len(frame) - max_rows} more rows in the table files</p>" \
        if len(frame) > max_rows else ""
    return f"<details><summary>{html.escape(title)}</summary>{body}{more}</details>"


def card_html(title: str, intro: str, tables: Mapping[str, Any], figures: Iterable[Any], max_figures: int = 6,
              max_rows: int = 20) -> str:
    """One result as a card.

    Args:
        title: the heading; intro: the paragraph under it.
        tables: ``{name: pandas.DataFrame}`` (folded, first ``max_rows`` rows).
        figures: objects with ``stem``, ``title``, ``caption``, ``paper`` and ``draw(path) -> files``
            (:class:`vitscope.analyses.result.Figure`); the first ``max_figures`` are drawn.
    """
    parts = [f"<div class='vitscope-card' style='{_STYLE}'><h3 style='margin:.2rem 0'>{html.escape(title)}</h3>"]
    if intro:
        parts.append(f"<p style='color:#445'>{html.escape(intro)}</p>")
    for k, figure in enumerate(figures):
        if k >= max_figures:
            parts.append("<p style='color:#667'>and more figures: write the run (vitscope.analyze) to see them "
                         "all in report.html</p>")
            break
        src = _png_of(figure)
        paper = f" ({html.escape(figure.paper)})" if getattr(figure, "paper", "") else ""
        caption = f"<figcaption><b>{html.escape(figure.title)}.</b> {html.escape(figure.caption)}{paper}</figcaption>"
        if src is None:
            continue
        if src.startswith("error:"):
            parts.append(f"<p style='color:#a00'>{html.escape(figure.title)} could not be drawn "
                         f"({html.escape(src[6:])})</p>")
            continue
        parts.append(f"<figure style='margin:.5rem 0'><img src='{src}' style='max-width:100%' "
                     f"alt='{html.escape(figure.title, quote=True)}'>{caption}</figure>")
    for name, frame in tables.items():
        parts.append(_table_html(name, frame, max_rows))
    parts.append("</div>")
    return "".join(parts)


def cards_html(heading: str, lines: Iterable[str], cards: Iterable[str]) -> str:
    """A run: a heading, a few summary lines, then one card per result."""
    summary = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
    return f"<div class='vitscope-run'><h2>{html.escape(heading)}</h2><ul>{summary}</ul>{''.join(cards)}</div>"
