"""The one data fingerprint: what resume, the feature cache and results.json use to recognise a dataset.

Method ``"stat"`` (sources with files): SHA-256 over the sorted ``(relative path, size in bytes, modification
time in ns)`` of every file the source reads (image files; for annotated formats every file under the dataset
root, annotations included). File contents are not read, so fingerprinting a large dataset costs one ``stat``
per file; a file rewritten in place with the same size and time keeps its fingerprint, and copying a dataset
(new modification times) changes it. Paths are relative to the dataset root, so moving the root keeps it.

Method ``"content"`` (sources without files: images in memory, the bundled sample photos): SHA-256 of the
source's content (:meth:`vitscope.data.source.Source.content_digest`: decoded pixels, or what defines them).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["CONTENT_METHOD", "FINGERPRINT_METHOD", "data_fingerprint", "stat_digest"]

FINGERPRINT_METHOD = "stat: sha256 of sorted (relative path, size, mtime_ns); contents not read"
CONTENT_METHOD = "content: sha256 of the decoded images (no files)"


def _signature(path: Path, root: Path) -> tuple[str, int, int]:
    try:
        rel = path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:  # outside the root (a file list pointing elsewhere): keep the absolute path
        rel = path.resolve().as_posix()
    try:
        st = path.stat()
    except OSError:
        return rel, -1, -1
    return rel, int(st.st_size), int(st.st_mtime_ns)


def stat_digest(paths: Iterable[str | os.PathLike], root: str | os.PathLike) -> tuple[str, int]:
    """``(sha256 hex, number of files)`` over the sorted stat signatures of ``paths`` relative to ``root``."""
    root = Path(root)
    entries = sorted(_signature(Path(p), root) for p in paths)
    h = hashlib.sha256()
    for entry in entries:
        h.update(repr(entry).encode("utf-8"))
    return h.hexdigest(), len(entries)


def data_fingerprint(source: Any) -> dict[str, Any]:
    """Fingerprint of a :class:`~vitscope.data.source.Source` (see the module docstring for what it covers).

    Returns:
        ``{"method", "digest" (16 hex chars), "num_files"}``.
    """
    files = source.fingerprint_files()
    if files is not None:
        paths, root = files
        digest, count = stat_digest(paths, root)
        return {"method": FINGERPRINT_METHOD, "digest": digest[:16], "num_files": count}
    return {"method": CONTENT_METHOD, "digest": source.content_digest()[:16], "num_files": len(source)}
