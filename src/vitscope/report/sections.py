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

__all__ = ["explorer_of", "resolved_config", "slug", "summary_rows"]

#: configuration keys whose given value (``auto``, null) the run resolves; results.json ``run`` holds what it chose
RESOLVED_KEYS = ("device", "workers")


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


def _device_text(device: Any) -> str:
    """``cuda:0 (NVIDIA H200, CUDA 12.4)`` from results.json's ``run.device``."""
    if not isinstance(device, Mapping):
        return str(device)
    extra = [str(device[k]) if k == "name" else f"{k.upper()} {device[k]}" for k in ("name", "cuda", "hip")
             if device.get(k)]
    return str(device.get("device")) + (f" ({', '.join(extra)})" if extra else "")


def resolved_config(doc: Mapping[str, Any]) -> dict[str, Any]:
    """results.json ``config`` as the report shows it: a setting the run resolved (``device auto``, ``workers
    null``) beside what it chose, from results.json ``run``."""
    config = dict(doc.get("config", {}))
    run = doc.get("run") or {}
    for key in RESOLVED_KEYS:
        if key not in run:
            continue
        chosen = _device_text(run[key]) if key == "device" else format_cell(run[key])
        given = config.get(key)
        config[key] = chosen if key not in config or str(given) == chosen else \
            f"{'null' if given is None else given} (resolved: {chosen})"
    return config


def _preprocessing_line(m: Mapping[str, Any]) -> str:
    """How a model's images were resized and normalised: input size, resize, interpolation, mean and std."""
    size = m.get("image_size")
    parts = [f"input {size[0]}x{size[1]} px" if isinstance(size, (list, tuple)) else f"input {size}"]
    resize = m.get("resize_size")
    if resize:
        parts.append("resize to " + ("x".join(map(str, resize)) if isinstance(resize, (list, tuple)) else
                                     f"{resize} px (short side)"))
    parts += [f"{m.get('interpolation', 'unrecorded')} interpolation", f"mean {format_cell(m.get('mean'))}",
              f"std {format_cell(m.get('std'))}"]
    return ", ".join(parts)


def _model_rows(m: Mapping[str, Any], number: str) -> list[tuple[str, str]]:
    """The summary rows of one model: what it is, its input, its preprocessing and its attention kernel."""
    rows = [(f"Model{number}", _model_line(m))]
    if m.get("image_size") and m.get("grid"):
        rows.append((f"Input{number}", input_text(m)))
    if m.get("mean") is not None:
        rows.append((f"Preprocessing{number}", _preprocessing_line(m)))
    if m.get("attention_kernel"):
        rows.append((f"Attention kernel{number}", f"{m['attention_kernel']}; patterns: {m.get('pattern_kernel')}"))
    return rows


#: class names a summary row shows (results.json lists every one)
CLASSES_SHOWN = 8


def _data_rows(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The data's format (and split), and where its labels come from with its classes."""
    rows = []
    if data.get("format"):
        rows.append(("Data format", str(data["format"]) + (f", split {data['split']}" if data.get("split") else "")))
    classes = list(data.get("classes") or [])
    if data.get("label_rule") or classes:
        shown = ", ".join(map(str, classes[:CLASSES_SHOWN])) + (", ..." if len(classes) > CLASSES_SHOWN else "")
        named = f"{len(classes)} classes ({shown})" if classes else ""
        rows.append(("Labels", "; ".join(t for t in (str(data.get("label_rule") or ""), named) if t)))
    return rows


def summary_rows(doc: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Summary table rows of a results.json document: models, their input, preprocessing and attention kernel,
    data, fingerprint, images, analyses not run, versions."""
    data = doc.get("data", {})
    fp = data.get("fingerprint")
    fp_text = f"{fp.get('digest')} ({fp.get('method')}, {fp.get('num_files')} files)" if isinstance(fp, dict) \
        else str(fp)
    models = doc.get("models", [])
    rows = []
    for i, m in enumerate(models):
        rows += _model_rows(m, f" {i + 1}" if len(models) > 1 else "")
    not_run = doc.get("skipped_analyses") or []
    named = ": ".join(str(v) for v in (data.get("name"), data.get("source")) if v)
    rows += [*([("Data", named)] if named else []), *_data_rows(data), *([("Data fingerprint", fp_text)] if fp else []),
             *([("Images analysed", format_cell(doc["num_images"]))] if doc.get("num_images") is not None else []),
             ("Skipped files", str(len(doc.get("skipped", [])))),
             *([("Analyses not run", not_run_text({s["analysis"]: s["reason"] for s in not_run}))] if not_run else []),
             ("vitscope version", str(doc.get("vitscope_version"))),
             ("Environment", ", ".join(f"{k} {v}" for k, v in doc.get("environment", {}).items()))]
    return rows
