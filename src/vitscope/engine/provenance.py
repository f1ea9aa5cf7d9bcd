"""What a run was made of: a fingerprint of the data and the identity of a model (stored in results.json).

Data fingerprint (method ``"stat"``): SHA-256 over the sorted ``(relative path, size in bytes, modification
time in ns)`` of every file the dataset reads (image files; for annotated formats every file under the
dataset root, annotations included). File contents are not read, so fingerprinting a large dataset costs
one ``stat`` per file; a file rewritten in place with the same size and time keeps its fingerprint, and
copying a dataset (new modification times) changes it. Paths are relative to the dataset root, so moving
the root folder keeps it. Built-in sources without files (``skimage``) hash their names and pixel shapes
(``SamplePhotos.describe``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["FINGERPRINT_METHOD", "data_fingerprint", "model_identity", "stat_digest"]

FINGERPRINT_METHOD = "stat: sha256 of sorted (relative path, size, mtime_ns); contents not read"


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


def _files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def data_fingerprint(dataset: Any) -> dict[str, Any]:
    """Fingerprint of the files behind ``dataset`` (see the module docstring for what it covers).

    Returns:
        ``{"method", "digest" (16 hex chars), "num_files"}``.
    """
    inner = getattr(dataset, "dataset", None)  # AnnotatedSource wraps a format reader with a root
    root = getattr(inner, "root", None)
    if root is not None and Path(root).is_dir():
        digest, count = stat_digest(_files_under(Path(root)), root)
    elif getattr(dataset, "_root", None) is not None and isinstance(getattr(dataset, "paths", None), list):
        digest, count = stat_digest(dataset.paths, dataset._root)
    else:  # no files on disk (built-in sample photos): their own content-derived fingerprint
        described = dataset.describe() if hasattr(dataset, "describe") else {"name": str(dataset)}
        key = repr(sorted(described.items())).encode("utf-8")
        return {"method": "describe: sha256 of the source description", "digest":
                str(described.get("fingerprint") or hashlib.sha256(key).hexdigest()[:16]),
                "num_files": int(described.get("num_files", len(dataset)))}
    return {"method": FINGERPRINT_METHOD, "digest": digest[:16], "num_files": count}


def model_identity(model_id: str, backbone: Any) -> dict[str, Any]:
    """What identifies a model in results.json: the id it was loaded by, its spec and a weights digest."""
    from vitscope.features.fingerprint import model_fingerprint

    return {"id": model_id, **backbone.spec.to_dict(), "weights_sha256": model_fingerprint(backbone)[:16]}
