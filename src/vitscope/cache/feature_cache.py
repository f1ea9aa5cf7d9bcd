"""The disk-backed feature cache: memory-mapped ``.npy`` arrays keyed by a fingerprint.

Layout: ``<root>/<key[:2]>/<key>/`` holds ``meta.json`` and one ``<column>.npy`` per column (e.g.
``index.npy`` ``[rows]`` dataset index of each row, ``block3.npy`` ``[rows, F]`` features of block 3).
An entry is written in a private folder under ``<root>/tmp/`` and renamed into place in one step, so a
reader sees a complete entry or none; two processes racing on one key both succeed and one copy is kept. An entry
is removed the other way round: renamed into ``tmp/`` in one step, then deleted there. What a killed process left
in ``tmp/`` is deleted by the next commit.
Arrays are read back as read-only memory maps (``np.load(mmap_mode="r")``): memory stays bounded by what
a consumer touches.

The key (:func:`vitscope.models.digest.digest` of a dict) covers the model weights, the data files,
the view (preprocessing), the hook site and the pooling, so an entry is reused across runs exactly when
none of them changed. ``max_bytes`` bounds the cache on disk: after each commit the least recently used
entries are removed until the total fits, except the entries in use (those of the extraction under way, and inside
:func:`held_entries` every entry served or committed since it opened).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import shutil
import time
import uuid
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from vitscope.atomic import remove_leftovers, staging_name
from vitscope.cache.rowstore import RowStore
from vitscope.errors import VitscopeKeyError, VitscopeValueError
from vitscope.strict_json import dumps

__all__ = ["CacheEntry", "FeatureCache", "default_cache_root", "held_entries"]

#: inside :func:`held_entries`: the keys served or committed so far, and the bounded caches that served them
_HELD: contextvars.ContextVar[tuple[set[str], dict[Path, FeatureCache]] | None] = contextvars.ContextVar(
    "vitscope_held_entries", default=None)


@contextlib.contextmanager
def held_entries() -> Iterator[None]:
    """Inside, no entry a feature cache serves or commits is evicted: a probe that reads the entries of several
    extractions together (DAVIS's sequences, the k-NN probe's train and test features) keeps them all, as one
    extraction keeps its own. When the outermost hold ends, every bounded cache it used is fitted to its
    ``max_bytes`` once (meanwhile the entries in use may exceed it)."""
    if _HELD.get() is not None:  # nested: the outer hold keeps them
        yield
        return
    held: tuple[set[str], dict[Path, FeatureCache]] = (set(), {})
    token = _HELD.set(held)
    try:
        yield
    finally:
        _HELD.reset(token)
        for cache in held[1].values():
            with contextlib.suppress(OSError):  # a read-only cache keeps its size
                cache.evict()


#: the staging folders this process is writing now (other threads' cleaning keeps them)
_WRITING: set[str] = set()


@contextlib.contextmanager
def _staging(tmp_root: Path) -> Iterator[Path]:
    """A new staging folder of this process in ``tmp_root``, deleted when the block ends; what killed processes
    (and this one before a container restarted it under the same id) left there is deleted first."""
    tmp = tmp_root / staging_name(uuid.uuid4().hex)
    _WRITING.add(tmp.name)  # before it exists, so that no cleaning meets it unregistered
    try:
        remove_leftovers(tmp_root, stale_pids=frozenset({os.getpid()}), keep=_WRITING)
        tmp.mkdir(parents=True)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        _WRITING.discard(tmp.name)


def default_cache_root() -> Path:
    """``$VITSCOPE_CACHE/features``, else ``$XDG_CACHE_HOME/vitscope/features``, else ``~/.cache/vitscope/features``."""
    if os.environ.get("VITSCOPE_CACHE"):
        return Path(os.environ["VITSCOPE_CACHE"]) / "features"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vitscope" / "features"


class CacheEntry:
    """One committed entry: ``meta`` (dict) and read-only memory-mapped columns.

    Attributes:
        key: the fingerprint.
        path: the entry's folder.
        meta: what was stored with it (request, view, grid, blocks, ...).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.key = self.path.name
        self.meta: dict[str, Any] = json.loads((self.path / "meta.json").read_text())

    @property
    def columns(self) -> list[str]:
        return list(self.meta["columns"])

    def array(self, name: str) -> np.ndarray:
        """Column ``name`` as a read-only memory map ``[rows, *tail]``."""
        if name not in self.meta["columns"]:
            raise VitscopeKeyError(f"cache entry {self.key[:12]} has no column '{name}'; it has {self.columns}")
        return np.load(self.path / f"{name}.npy", mmap_mode="r")

    def block(self, i: int) -> np.ndarray:
        """Features of block ``i``: ``[rows, *tail]`` memory map."""
        return self.array(f"block{i}")

    @property
    def blocks(self) -> list[int]:
        return [int(b) for b in self.meta.get("blocks", [])]

    @property
    def index(self) -> np.ndarray:
        """``[rows]`` dataset index (image position) of every row, ascending."""
        return np.asarray(self.array("index"))

    def __len__(self) -> int:
        return int(self.meta["rows"])

    def __repr__(self) -> str:
        return f"CacheEntry({self.key[:12]}, rows={len(self)}, columns={self.columns})"


class FeatureCache:
    """A folder of feature entries keyed by fingerprint.

    Args:
        root: cache folder (created on first write); default :func:`default_cache_root`.
        max_bytes: if set, least recently used entries are removed after a commit until the cache fits (not those
            in use: :func:`held_entries`).
    """

    def __init__(self, root: str | os.PathLike | None = None, max_bytes: int | None = None) -> None:
        self.root = Path(root) if root is not None else default_cache_root()
        self.max_bytes = max_bytes

    def _path(self, key: str) -> Path:
        if len(key) < 8 or not all(c in "0123456789abcdef" for c in key):
            raise VitscopeValueError(f"cache keys are hex digests, got {key!r}")
        return self.root / key[:2] / key

    def get(self, key: str) -> CacheEntry | None:
        """The committed entry of ``key``, or None; a hit refreshes its last-use time."""
        path = self._path(key)
        try:
            entry = CacheEntry(path)
        except (FileNotFoundError, NotADirectoryError):  # none, or another process took it out meanwhile
            return None
        with contextlib.suppress(OSError):  # a read-only cache still serves hits
            os.utime(path / "meta.json")
        self._hold(key)
        return entry

    def _hold(self, key: str) -> None:
        held = _HELD.get()
        if held is not None:
            held[0].add(key)
            if self.max_bytes is not None:
                held[1][self.root] = self

    def commit(self, key: str, store: RowStore, meta: Mapping[str, Any], sort_by: str = "index",
               evict: bool = True) -> CacheEntry:
        """Write every column of ``store`` sorted by ``sort_by`` and publish it atomically under ``key``.

        Memory stays bounded: rows are copied chunk by chunk into memory-mapped ``.npy`` files.

        Args:
            key: fingerprint (hex digest).
            store: the rows (must hold a ``sort_by`` column).
            meta: JSON-able description stored as ``meta.json`` (``columns``, ``rows``, ``key`` are added).
            sort_by: column ordering the rows (stable).
            evict: then fit the cache in ``max_bytes``, keeping this entry (a caller committing several entries that
                must all stay evicts once after the last, keeping them all).

        Returns:
            The committed entry (an existing one if another process committed ``key`` first).
        """
        final = self._path(key)
        self._hold(key)
        if (final / "meta.json").is_file():
            return CacheEntry(final)
        if store.rows and sort_by not in store.schema:
            raise VitscopeValueError(f"cannot commit a store without a '{sort_by}' column (it has "
                                     f"{sorted(store.schema)})")
        with _staging(self.root / "tmp") as tmp:
            outs = {}
            for name, (dtype, tail) in store.schema.items():
                if store.rows == 0:  # a zero-length file cannot be memory-mapped
                    np.save(tmp / f"{name}.npy", np.zeros((0, *tail), dtype=np.dtype(dtype)))
                    continue
                outs[name] = np.lib.format.open_memmap(tmp / f"{name}.npy", mode="w+", dtype=np.dtype(dtype),
                                                       shape=(store.rows, *tail))
            if outs:
                store.write_sorted(sort_by, outs)
            for arr in outs.values():
                arr.flush()
            del outs
            doc = {**dict(meta), "key": key, "rows": store.rows, "created": time.time(),
                   "columns": {n: {"dtype": d, "shape": list(t)} for n, (d, t) in store.schema.items()}}
            (tmp / "meta.json").write_text(dumps(doc, indent=1))
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(tmp, final)
            except OSError:  # another process published the same key first: keep theirs
                if not (final / "meta.json").is_file():
                    raise
        if evict and self.max_bytes is not None:
            self.evict(keep=key)
        return CacheEntry(final)

    def keys(self) -> list[str]:
        """Keys of every committed entry."""
        if not self.root.is_dir():
            return []
        return sorted(p.parent.name for p in self.root.glob("??/*/meta.json"))

    @staticmethod
    def _size(path: Path) -> int:
        return sum(f.stat().st_size for f in path.iterdir() if f.is_file())

    def size_bytes(self) -> int:
        """Bytes used by committed entries."""
        return sum(self._size(self._path(k)) for k in self.keys())

    def evict(self, keep: str | Collection[str] | None = None) -> list[str]:
        """Remove least recently used entries (never those of ``keep``: a key or several, nor those in use inside
        :func:`held_entries`) until the cache fits ``max_bytes``.

        Returns:
            The removed keys.
        """
        if self.max_bytes is None:
            return []
        kept = {keep} if isinstance(keep, str) else set(keep or ())
        held = _HELD.get()
        kept |= held[0] if held is not None else set()
        entries = [(self._path(k), k) for k in self.keys()]
        info = sorted(((p / "meta.json").stat().st_mtime, self._size(p), k, p) for p, k in entries)
        total = sum(size for _, size, _, _ in info)
        removed = []
        for _, size, k, p in info:
            if total <= self.max_bytes:
                break
            if k in kept or not self._discard(p):
                continue
            total -= size
            removed.append(k)
        return removed

    def remove(self, key: str) -> bool:
        """Delete one entry; returns whether it existed."""
        path = self._path(key)
        if not path.is_dir():
            return False
        self._discard(path)
        return True

    def _discard(self, path: Path) -> bool:
        """Take the entry at ``path`` out of the cache in one rename, then delete it: a process killed while
        deleting leaves a leftover in ``tmp/``, never a damaged entry that :meth:`get` would serve. Returns whether
        it was taken out (not when another process took it first, or the cache is read-only)."""
        trash = self.root / "tmp" / staging_name(uuid.uuid4().hex)
        try:
            trash.parent.mkdir(parents=True, exist_ok=True)
            os.rename(path, trash)
        except OSError:
            return False
        shutil.rmtree(trash, ignore_errors=True)
        return True
