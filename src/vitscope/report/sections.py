"""Pieces every report shares: section ids, the explorer of a result's block x head maps, the summary rows of a
run."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from vitscope.analyses.registry import not_run_text
from vitscope.analyses.result import Result
from vitscope.models.spec import input_text
from vitscope.report.explorer import explorer_from_maps
from vitscope.report.model import Explorer
from vitscope.report.tables import format_cell

__all__ = ["explorer_of", "slug", "summary_rows"]


def slug(text: str) -> str:
    """An HTML id from any text (letters, digits, ``-``)."""
    return re.sub(r"[^a-zA-Z0-9]+", "-", text).strip("-").lower() or "section"


def explorer_of(result: Result, title: str | None = None, max_images: int = 4) -> Explorer | None:
    """The block x head explorer of a result that declares one
    (:meth:`~vitscope.analyses.result.Result.explorer_maps`), else None."""
    maps = result.explorer_maps()
    if maps is None:
        return None
    return explorer_from_maps(
        title or f"Block x head explorer: {maps.what}", maps.mean_map, maps.blocks, maps.image_maps, maps.images,
        maps.image_names, max_images,
        caption="Point at (or tab to) a cell to enlarge that head's map; the buttons switch between the dataset "
                "mean and single images (drawn over the image). Each map is scaled to its own range. " + maps.caption,
        paper=maps.paper)


def _model_line(m: Mapping[str, Any]) -> str:
    kind = f"{m.get('num_blocks')} blocks, {m.get('num_heads')} heads" if m.get("num_heads") else \
        f"{m.get('num_blocks')} stages (CNN)"
    weights = m.get("weights_sha256", "?")
    shown = m.get("display_name")
    named = f"{shown}: " if shown and shown != m.get("id") else ""  # compare --models NAME=MODEL
    return f"{named}{m.get('id', m.get('name'))} ({m.get('family', '')}, {kind}, weights sha256 {weights})"


def summary_rows(doc: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Summary table rows of a results.json document: models, their input, data, fingerprint, images, analyses not
    run, versions."""
    data = doc.get("data", {})
    fp = data.get("fingerprint")
    fp_text = f"{fp.get('digest')} ({fp.get('method')}, {fp.get('num_files')} files)" if isinstance(fp, dict) \
        else str(fp)
    models = doc.get("models", [])
    rows = []
    for i, m in enumerate(models):
        number = f" {i + 1}" if len(models) > 1 else ""
        rows.append((f"Model{number}", _model_line(m)))
        if m.get("image_size") and m.get("grid"):
            rows.append((f"Input{number}", input_text(m)))
    not_run = doc.get("skipped_analyses") or []
    named = ": ".join(str(v) for v in (data.get("name"), data.get("source")) if v)
    rows += [*([("Data", named)] if named else []), *([("Data fingerprint", fp_text)] if fp else []),
             *([("Images analysed", format_cell(doc["num_images"]))] if doc.get("num_images") is not None else []),
             ("Skipped files", str(len(doc.get("skipped", [])))),
             *([("Analyses not run", not_run_text({s["analysis"]: s["reason"] for s in not_run}))] if not_run else []),
             ("vitscope version", str(doc.get("vitscope_version"))),
             ("Environment", ", ".join(f"{k} {v}" for k, v in doc.get("environment", {}).items()))]
    return rows
