"""Render a :class:`~vitscope.report.model.Report` to one self-contained HTML file.

Jinja2 with autoescaping on for every value (model ids, paths and config values come from the user);
images become ``data:`` URIs (a PNG over :data:`EMBED_BYTES`, a figure or a photo under an explorer, is
embedded as a JPEG: the page stays light, the full PNG stays in ``figures/``), and a Content-Security-Policy
forbids the page from fetching anything, so the file opens from ``file://`` without a server and makes no
request.
"""

from __future__ import annotations

import base64
import os
from functools import cache
from pathlib import Path
from typing import Any

from vitscope.errors import VitscopeValueError
from vitscope.report.assets import chart_script, echarts_script
from vitscope.report.model import Report
from vitscope.report.references import cited, paper_number
from vitscope.strict_json import dumps

__all__ = ["EMBED_BYTES", "THUMBNAIL_WIDTH", "data_uri", "pixel_width", "render_html", "thumbnail_uri"]

#: figure pictures wider than this are shown in the page downscaled to it (the full-size file stays in
#: figures/, one click away): a report of a few dozen big figures stays a few megabytes
THUMBNAIL_WIDTH = 1100

#: PNG files larger than this are embedded re-encoded as JPEG (quality 85): dense attention-map grids and
#: photo panels shrink 3-5x, line plots are small and stay PNG
EMBED_BYTES = 200_000

_MIME = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif", ".webp": "image/webp"}


def data_uri(source: bytes | str | os.PathLike) -> str:
    """``data:`` URI of PNG or JPEG bytes or of an image file (PNG, JPEG, GIF, WebP)."""
    if isinstance(source, (bytes, bytearray)):
        raw = bytes(source)
        mime = "image/jpeg" if raw.startswith(b"\xff\xd8\xff") else "image/png"
    else:
        path = Path(source)
        mime = _MIME.get(path.suffix.lower())
        if mime is None:
            raise VitscopeValueError(f"cannot embed {path.name}: only {', '.join(_MIME)} images are embedded")
        raw = path.read_bytes()
    if mime == "image/png" and len(raw) > EMBED_BYTES:  # figure files and the explorer's photos alike
        raw, mime = _as_jpeg(raw)
    return f"data:{mime};base64,{base64.b64encode(raw).decode('ascii')}"


def pixel_width(path: str | os.PathLike) -> int:
    """Width in pixels of an image file (multi-panel figures wider than a column get the full width)."""
    from PIL import Image

    with Image.open(path) as image:
        return int(image.width)


def thumbnail_uri(path: str | os.PathLike) -> str:
    """``data:`` URI of a figure file for the page: at most :data:`THUMBNAIL_WIDTH` pixels wide (Lanczos), then
    as :func:`data_uri` (a large result re-encoded as JPEG)."""
    import io

    from PIL import Image

    path = Path(path)
    with Image.open(path) as image:
        if image.width <= THUMBNAIL_WIDTH:
            return data_uri(path)
        small = image.convert("RGBA" if "A" in image.getbands() else "RGB")
        small = small.resize((THUMBNAIL_WIDTH, max(1, round(image.height * THUMBNAIL_WIDTH / image.width))),
                             Image.LANCZOS)
    buf = io.BytesIO()
    small.save(buf, format="PNG", optimize=True)
    return data_uri(buf.getvalue())


def _text_px(path: str | os.PathLike) -> str:
    """The smallest font size of a figure file in pixels ("" when unknown): the page keeps it beside the
    picture so anyone (and the browser tests) can see how small its text appears once the picture is scaled."""
    from vitscope.viz.raster import smallest_text_px

    value = smallest_text_px(path)
    return "" if value is None else f"{value:g}"


def _as_jpeg(png: bytes) -> tuple[bytes, str]:
    """``(bytes, mime)``: the picture of ``png`` as JPEG (transparency over white), or ``png`` itself when the
    JPEG is not smaller."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        rgba = image.convert("RGBA")
    flat = Image.new("RGB", rgba.size, "white")
    flat.paste(rgba, mask=rgba.getchannel("A"))
    out = io.BytesIO()
    flat.save(out, format="JPEG", quality=85, optimize=True)
    return (out.getvalue(), "image/jpeg") if out.tell() < len(png) else (png, "image/png")


@cache
def _environment():
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("vitscope.report", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["data_uri"] = data_uri
    env.filters["thumbnail_uri"] = thumbnail_uri
    env.filters["pixel_width"] = pixel_width
    env.filters["text_px"] = _text_px
    env.filters["paper_id"] = paper_number
    env.policies["json.dumps_function"] = dumps  # embedded charts: null, never NaN (JSON.parse refuses it)
    return env


def _config_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    return dumps(value)


def render_html(report: Report) -> str:
    """The report as an HTML string (every text value escaped)."""
    from vitscope._version import __version__

    rows = [(str(k), _config_value(v)) for k, v in report.config.items()]
    has_charts = any(f.chart for s in report.sections for f in s.figures)
    texts = [report.subtitle, *report.notes]
    for s in report.sections:
        texts += [s.intro, *(f.caption for f in s.figures), *(f.paper for f in s.figures),
                  *(e.caption for e in s.explorers), *(e.paper for e in s.explorers),
                  *(p.caption for p in s.pair_explorers), *(p.paper for p in s.pair_explorers),
                  *(t.note for t in s.tables)]
    scripts = {"echarts_script": echarts_script(), "chart_script": chart_script()} if has_charts else \
        {"echarts_script": "", "chart_script": ""}
    return _environment().get_template("report.html.j2").render(report=report, config_rows=rows, version=__version__,
                                                                has_charts=has_charts, references=cited(texts),
                                                                **scripts)
