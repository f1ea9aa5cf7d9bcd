"""Write a file so that a reader never sees half of it: a temporary file in the same folder, then ``os.replace``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["write_json_atomic", "write_text_atomic"]


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (its folder is created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_json_atomic(path: str | os.PathLike, doc: Any) -> Path:
    """``doc`` as indented JSON, atomically."""
    return write_text_atomic(path, json.dumps(doc, indent=1, default=str))
