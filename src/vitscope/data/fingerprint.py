"""The one data fingerprint: what resume, the feature cache and results.json use to recognise a dataset.

Method ``"stat"`` (sources with files): SHA-256 over the ``(relative path, size in bytes, modification time in
ns)`` of every file the source reads, in the source's order (image files, whose order is the images' positions:
a list given in another order is another dataset; for a format reader the files of the items it selected, its split
or its list, in their order, then its annotation, list or split file, so two splits or lists under one root are two
datasets). File contents are not read, so fingerprinting a large dataset costs one ``stat`` per file; a file
rewritten in place with the same size and time keeps its fingerprint, and copying a dataset (new modification times)
changes it. Paths are relative to the dataset root, so moving the root keeps it.

Method ``"content"`` (sources without files: images in memory, the bundled sample photos): SHA-256 of the
source's content (:meth:`vitscope.data.source.Source.content_digest`: decoded pixels, or what defines them).

Either way, what defines the items in memory rather than in a file (labels passed beside a path list or images, a
``datasets`` object's selection of rows) is hashed in too (:meth:`vitscope.data.source.Source.memory_digest`).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["CONTENT_METHOD", "FINGERPRINT_METHOD", "data_fingerprint", "held_fingerprints", "stat_digest"]

FINGERPRINT_METHOD = "stat: sha256 of (relative path, size, mtime_ns) in the source's order; contents not read"
CONTENT_METHOD = "content: sha256 of the decoded images (no files)"


class _Signatures:
    """``(relative path, size, mtime_ns)`` of files under one root: the root and every folder resolved once (a
    ``realpath`` walks every component of a path), each file one ``lstat``, and a second ``stat`` only for a link."""

    def __init__(self, root: Path) -> None:
        self.root = os.path.realpath(root)
        self.folders: dict[str, str] = {}

    def __call__(self, path: str | os.PathLike) -> tuple[str, int, int]:
        path = os.fspath(path)
        folder, name = os.path.split(os.path.abspath(path))
        real_folder = self.folders.get(folder)
        if real_folder is None:
            real_folder = self.folders[folder] = os.path.realpath(folder)
        try:
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                real = os.path.realpath(path)
                st = os.stat(path)
            else:
                real = os.path.join(real_folder, name)
        except OSError:  # missing, or a link to nothing
            real, st = os.path.realpath(path), None
        rel = os.path.relpath(real, self.root)
        if rel == os.pardir or rel.startswith(os.pardir + os.sep):  # outside the root: keep the absolute path
            rel = real
        rel = Path(rel).as_posix()
        return (rel, -1, -1) if st is None else (rel, int(st.st_size), int(st.st_mtime_ns))


def stat_digest(paths: Iterable[str | os.PathLike], root: str | os.PathLike) -> tuple[str, int]:
    """``(sha256 hex, number of files)`` over the stat signatures of ``paths`` relative to ``root``, in their order
    (a source whose files have no order of their own lists them sorted)."""
    signature = _Signatures(Path(root))
    entries = [signature(p) for p in paths]
    h = hashlib.sha256()
    for entry in entries:
        h.update(repr(entry).encode("utf-8"))
    return h.hexdigest(), len(entries)


#: inside :func:`held_fingerprints`: id(source) -> (the source, held so that its id stays its own; its fingerprint)
_HELD: contextvars.ContextVar[dict[int, tuple[Any, dict[str, Any]]] | None] = contextvars.ContextVar(
    "vitscope_fingerprints", default=None)


@contextlib.contextmanager
def held_fingerprints() -> Iterator[None]:
    """Inside, each source is fingerprinted once: a command that reads a dataset in several passes (the probe's
    extractions, a run after its cache lookup) stats a million files once, not once a pass. Outside, every call
    reads the files again, so a long-lived session sees files that changed."""
    if _HELD.get() is not None:  # nested: the outer command's
        yield
        return
    token = _HELD.set({})
    try:
        yield
    finally:
        _HELD.reset(token)


def data_fingerprint(source: Any) -> dict[str, Any]:
    """Fingerprint of a :class:`~vitscope.data.source.Source` (see the module docstring for what it covers).

    Returns:
        ``{"method", "digest" (16 hex chars), "num_files"}``.
    """
    held = _HELD.get()
    if held is not None and id(source) in held:
        return dict(held[id(source)][1])
    found = _fingerprint(source)
    if held is not None:
        held[id(source)] = (source, found)
    return dict(found)


def _fingerprint(source: Any) -> dict[str, Any]:
    files = source.fingerprint_files()
    if files is not None:
        paths, root = files
        digest, count = stat_digest(paths, root)
        method = FINGERPRINT_METHOD
    else:
        digest, count, method = source.content_digest(), len(source), CONTENT_METHOD
    in_memory = source.memory_digest()
    if in_memory is not None:
        digest = hashlib.sha256(f"{digest}:{in_memory}".encode()).hexdigest()
    return {"method": method, "digest": digest[:16], "num_files": count}
