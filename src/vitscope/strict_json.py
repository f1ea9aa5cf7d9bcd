"""JSON that every parser reads: numbers that are not finite (NaN, infinities) are written as ``null``.

Python's ``json`` writes ``NaN`` and ``Infinity``, which are not JSON: JavaScript's ``JSON.parse`` and most
other parsers refuse the file. Every JSON file vitscope writes (results.json, ``tables/*.json``,
``charts/*.json``, the manifest, the report's embedded charts) goes through :func:`dumps`. Where an analysis
knows why a value is not a number, its summary says so under :data:`NULL_REASONS` (docs/architecture.md,
"Typed results and one writer").
"""

from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vitscope.atomic import write_text_atomic

__all__ = ["NULL_REASONS", "dumps", "finite", "note_null", "write_json_atomic"]

#: summary key holding ``{key: why its value is null}`` (a dotted key for a nested value: ``stage_focus.coach``)
NULL_REASONS = "null_reasons"


def _key(key: Any) -> Any:
    """A mapping key JSON takes: text, a Python number or bool as they are; a numpy or torch scalar as its Python
    number; a number that is not finite, or anything else, as its text."""
    if isinstance(key, (str, bool)) or key is None:
        return key
    if hasattr(key, "dtype") and callable(getattr(key, "item", None)):
        key = key.item()
    if isinstance(key, numbers.Integral):
        return int(key)
    if isinstance(key, numbers.Real) and math.isfinite(key):
        return float(key)
    return str(key)


def finite(doc: Any) -> Any:
    """A copy of ``doc`` with every number that is not finite replaced by None (mappings, lists and tuples are
    walked; numpy arrays and scalars and torch tensors become Python lists and numbers, so their values are
    written as numbers rather than as their text; anything else is kept as is)."""
    if isinstance(doc, Mapping):
        return {_key(k): finite(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [finite(v) for v in doc]
    if isinstance(doc, (bool, int, str)) or doc is None:
        return doc
    if hasattr(doc, "dtype") and callable(getattr(doc, "tolist", None)):  # numpy arrays and scalars, torch tensors
        return finite(doc.tolist())
    if isinstance(doc, numbers.Integral):  # numpy integers
        return int(doc)
    if isinstance(doc, numbers.Real):  # float, numpy floats
        value = float(doc)
        return value if math.isfinite(value) else None
    return doc


def dumps(doc: Any, **kwargs: Any) -> str:
    """``doc`` as strict JSON text (:func:`finite` first; other objects as ``str``); ``kwargs`` go to
    :func:`json.dumps` (``indent``, ``sort_keys``...)."""
    kwargs.setdefault("default", str)
    return json.dumps(finite(doc), allow_nan=False, **kwargs)


def write_json_atomic(path: str | os.PathLike, doc: Any) -> Path:
    """``doc`` as indented strict JSON, written atomically."""
    return write_text_atomic(path, dumps(doc, indent=1))


def note_null(summary: dict[str, Any], key: str, reason: str) -> None:
    """Record in ``summary`` (a result's metadata) why its value ``key`` is not a number.

    Args:
        summary: the dict written as the summary (``Result.meta``).
        key: the summary key, dotted for a nested value (``stage_focus.coach``).
        reason: one short phrase, e.g. ``"no query has a positive under the easy protocol"``.
    """
    summary.setdefault(NULL_REASONS, {})[key] = reason
