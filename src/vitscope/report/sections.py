"""Build the report of ``vitscope analyze`` from its results.json document and in-memory results."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vitscope.report.captions import caption_for, section_intro
from vitscope.report.explorer import explorer_from_maps
from vitscope.report.model import Explorer, FigureItem, Report, Section
from vitscope.report.tables import format_cell, summary_tables

__all__ = ["analysis_section", "analyze_report", "explorer_of", "summary_rows"]

_EXPLORER_SOURCES = ("cls_attention_maps", "spatial_average_maps")


def slug(text: str) -> str:
    """An HTML id from any text (letters, digits, ``-``)."""
    return re.sub(r"[^a-zA-Z0-9]+", "-", text).strip("-").lower() or "section"


def _title(name: str) -> str:
    return name.replace("_", " ").capitalize()


def explorer_of(result: Any, title: str | None = None, max_images: int = 4) -> Explorer | None:
    """Explorer of an attention-maps result (``mean_map`` ``[L, H, h, w]`` plus chosen images), or None."""
    tensors = getattr(result, "tensors", {})
    if "mean_map" not in tensors or tensors["mean_map"].dim() != 4:
        return None
    meta = getattr(result, "meta", {})
    indices = list(meta.get("image_indices", []))
    what = meta.get("what", result.name)
    _, caption, paper = caption_for(f"{result.name}_mean")
    return explorer_from_maps(
        title or f"Block x head explorer: {what}", tensors["mean_map"], meta.get("blocks"),
        tensors.get("image_maps"), tensors.get("images"), [f"image {i}" for i in indices], max_images,
        caption="Point at (or tab to) a cell to enlarge that head's map; the buttons switch between the dataset "
                "mean and single images (drawn over the image). Each map is scaled to its own range. " + caption,
        paper=paper)


def analysis_section(out: Path, name: str, entry: Mapping[str, Any], result: Any = None) -> Section:
    """The section of one analysis: intro, explorer (attention maps), PNG figures and tables."""
    figures = []
    for rel in entry.get("files", {}).get("figures", []):
        if rel.endswith(".png"):
            title, caption, paper = caption_for(Path(rel).stem)
            figures.append(FigureItem(out / rel, title, caption, paper))
    explorers = []
    if result is not None and name in _EXPLORER_SOURCES:
        ex = explorer_of(result)
        if ex is not None:
            explorers.append(ex)
    return Section(slug(name), _title(name), section_intro(name), figures, summary_tables(name, entry["summary"]),
                   explorers)


def _model_line(m: Mapping[str, Any]) -> str:
    kind = f"{m.get('num_blocks')} blocks, {m.get('num_heads')} heads" if m.get("num_heads") else \
        f"{m.get('num_blocks')} stages (CNN)"
    weights = m.get("weights_sha256", "?")
    return f"{m.get('id', m.get('name'))} ({m.get('family', '')}, {kind}, weights sha256 {weights})"


def summary_rows(doc: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Summary table rows of a results.json document: models, data, fingerprint, images, versions."""
    data = doc.get("data", {})
    fp = data.get("fingerprint")
    fp_text = f"{fp.get('digest')} ({fp.get('method')}, {fp.get('num_files')} files)" if isinstance(fp, dict) \
        else str(fp)
    rows = [(f"Model {i + 1}" if len(doc.get("models", [])) > 1 else "Model", _model_line(m))
            for i, m in enumerate(doc.get("models", []))]
    rows += [("Data", f"{data.get('name', '')}: {data.get('source', '')}"), ("Data fingerprint", fp_text),
             ("Images analysed", format_cell(doc.get("num_images"))),
             ("Skipped files", str(len(doc.get("skipped", [])))),
             ("vitscope version", str(doc.get("vitscope_version"))),
             ("Environment", ", ".join(f"{k} {v}" for k, v in doc.get("environment", {}).items()))]
    return rows


def analyze_report(out: Path, doc: Mapping[str, Any], results: Mapping[str, Any] | None = None) -> Report:
    """The whole report of one ``vitscope analyze`` run.

    Args:
        out: the output folder (figure paths in ``doc`` are relative to it).
        doc: the results.json document.
        results: the in-memory Results (for the explorer's maps); None leaves explorers out.
    """
    models = ", ".join(str(m.get("id", m.get("name"))) for m in doc.get("models", []))
    sections = [analysis_section(out, name, entry, (results or {}).get(name))
                for name, entry in doc.get("analyses", {}).items()]
    notes = [f"{len(doc['skipped'])} unreadable file(s) were skipped; results.json lists them."] \
        if doc.get("skipped") else []
    return Report(title=f"vitscope analyze: {models}", subtitle=f"data: {doc.get('data', {}).get('name', '')}",
                  summary=summary_rows(doc), config=dict(doc.get("config", {})), sections=sections, notes=notes)
