"""Pieces every report shares: section ids, the explorer of attention maps, the summary rows of a run."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from vitscope.analyses.registry import not_run_text
from vitscope.models.spec import input_text
from vitscope.report.explorer import explorer_from_maps
from vitscope.report.model import Explorer
from vitscope.report.tables import format_cell
from vitscope.viz.labels import display_name

__all__ = ["explorer_of", "slug", "summary_rows"]

_EXPLORER_SOURCES = ("cls_attention_maps", "spatial_average_maps")


def slug(text: str) -> str:
    """An HTML id from any text (letters, digits, ``-``)."""
    return re.sub(r"[^a-zA-Z0-9]+", "-", text).strip("-").lower() or "section"


def _title(name: str) -> str:
    return display_name(name)


def explorer_of(result: Any, title: str | None = None, max_images: int = 4) -> Explorer | None:
    """Explorer of an attention-maps result (``mean_map`` ``[L, H, h, w]`` plus chosen images), or None."""
    tensors = getattr(result, "tensors", {})
    if "mean_map" not in tensors or tensors["mean_map"].dim() != 4:
        return None
    meta = getattr(result, "meta", {})
    indices = list(meta.get("image_indices", []))
    what = meta.get("what", result.name)
    mean = next((f for f in result.figures() if f.stem.endswith("_mean")), None)
    caption, paper = (mean.caption, mean.paper) if mean is not None else ("", "")
    return explorer_from_maps(
        title or f"Block x head explorer: {what}", tensors["mean_map"], meta.get("blocks"),
        tensors.get("image_maps"), tensors.get("images"),
        list(meta.get("image_names") or [f"image {i}" for i in indices]), max_images,
        caption="Point at (or tab to) a cell to enlarge that head's map; the buttons switch between the dataset "
                "mean and single images (drawn over the image). Each map is scaled to its own range. " + caption,
        paper=paper)


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
    rows += [("Data", f"{data.get('name', '')}: {data.get('source', '')}"), ("Data fingerprint", fp_text),
             ("Images analysed", format_cell(doc.get("num_images"))),
             ("Skipped files", str(len(doc.get("skipped", [])))),
             *([("Analyses not run", not_run_text({s["analysis"]: s["reason"] for s in not_run}))] if not_run else []),
             ("vitscope version", str(doc.get("vitscope_version"))),
             ("Environment", ", ".join(f"{k} {v}" for k, v in doc.get("environment", {}).items()))]
    return rows
