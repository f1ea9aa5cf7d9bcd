"""``RowStore``: an append-only table of numpy columns that spills to disk, for accumulators that need every row.

Analyses that need all examples at once (k-means, k-NN, probes, full-batch CKA) keep their rows here
instead of in memory (docs/architecture.md, "Declared state"). Rows are held in memory until ``spill_bytes`` is
reached, then appended to raw files of an open *shard* on disk and read back as memory maps. Memory stays bounded by
``spill_bytes`` plus one batch.

Sharing rule (what makes ``merge``, pickling and ``state_dict`` safe): a shard is *sealed* before any
other object may reference it (:meth:`seal` runs on pickling and on :meth:`extend`), and sealed shards are
never written again; later spills open a new shard. Shards live in ``workdir`` (default: a private
temporary folder removed when the process exits, :mod:`vitscope.cache.row_folders`; pass a persistent folder to
resume a run in another process). A store deletes files only when asked (:meth:`release`), and then only the
shards it wrote itself in a private folder: a copy (pickled, deep-copied, extended into another store) never
deletes anything, and :meth:`linked_copy` gives a store its own hard links to another's rows, so that either may
then release.

Row order is append order within one store but unspecified after :meth:`extend`: consumers sort by a key
column (the dataset index), which also makes ``merge(A(x1), A(x2))`` equal ``A(x1 + x2)``.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitscope.cache.host_copy import HostCopies, numpy_dtype, start_host_copy, torch_dtype
from vitscope.cache.row_folders import (
    export_folder,
    exported_when_pickled,
    is_private,
    link_or_copy,
    private_folder,
    private_rows_under,
)
from vitscope.errors import VitscopeFileNotFoundError, VitscopeKeyError, VitscopeValueError

__all__ = ["RowStore", "exported_when_pickled", "private_rows_under"]


class RowStore:
    """Append-only named columns ``{name: [rows, *tail]}`` with a fixed dtype and tail shape per column.

    Args:
        workdir: folder for spilled shards; None = a private temporary folder (removed at exit).
        spill_bytes: in-memory bytes above which rows move to disk (default 64 MiB).
    """

    def __init__(self, workdir: str | Path | None = None, spill_bytes: int = 64 << 20) -> None:
        self.workdir = None if workdir is None else str(workdir)
        self.spill_bytes = int(spill_bytes)
        self.schema: dict[str, tuple[str, tuple[int, ...]]] = {}
        self.rows = 0
        self._memory: list[dict[str, np.ndarray]] = []
        self._memory_bytes = 0
        self._sealed: list[tuple[str, int]] = []  # (shard folder, rows), immutable
        self._open: list[Any] | None = None  # [shard folder, rows] being appended to
        self._own: set[str] = set()  # shard folders this store wrote itself (only these may be released)
        self._copies = HostCopies()  # copies of device rows into ``_memory`` still under way

    # -- writing -----------------------------------------------------------------------
    def append(self, columns: Mapping[str, Any]) -> None:
        """Append rows: every column ``[b, *tail]`` with the same b.

        Tensors are copied to the host without waiting for their device (:mod:`vitscope.cache.host_copy`), in the
        column's dtype, converted on the device; the store waits for the copies only before it reads or writes
        the rows (a spill to disk, reading, pickling).
        """
        shapes = {k: tuple(v.shape) for k, v in columns.items() if isinstance(v, torch.Tensor)}
        arrays = {k: np.asarray(v) for k, v in columns.items() if not isinstance(v, torch.Tensor)}
        shapes.update({k: a.shape for k, a in arrays.items()})
        if not shapes:
            return
        sizes = {s[0] if s else -1 for s in shapes.values()}
        if len(sizes) != 1 or -1 in sizes:
            raise VitscopeValueError(f"every column needs the same number of rows, got {list(shapes.values())}")
        if not self.schema:
            self.schema = {k: (_dtype_str(v), tuple(shapes[k][1:])) for k, v in columns.items()}
        elif set(shapes) != set(self.schema):
            raise VitscopeValueError(f"columns {sorted(shapes)} differ from the store's {sorted(self.schema)}")
        for k, shape in shapes.items():
            if tuple(shape[1:]) != self.schema[k][1]:
                raise VitscopeValueError(
                    f"column '{k}' has rows of shape {tuple(shape[1:])} here but {self.schema[k][1]} before (rows "
                    "of one column must match: use one input size, or one token selection, for the whole run)"
                )
        if sizes == {0}:
            return
        for k, v in columns.items():
            dtype = self.schema[k][0]
            if isinstance(v, torch.Tensor):
                arrays[k], event = start_host_copy(v, torch_dtype(dtype))
                self._copies.add(event)
            else:
                arrays[k] = np.ascontiguousarray(arrays[k], dtype=np.dtype(dtype))
        b = sizes.pop()
        self._memory.append(arrays)
        self._memory_bytes += sum(a.nbytes for a in arrays.values())
        self.rows += b
        if self._memory_bytes > self.spill_bytes:
            self._spill()

    def _folder(self) -> Path:
        if self.workdir is None:
            self.workdir = private_folder()
        root = Path(self.workdir)
        root.mkdir(parents=True, exist_ok=True)
        return root

    def _spill(self) -> None:
        """Append the in-memory rows to the open shard (opening one if needed)."""
        if not self._memory:
            return
        self._copies.wait()
        if self._open is None:
            folder = self._folder() / f"shard-{uuid.uuid4().hex}"
            folder.mkdir()
            self._open = [str(folder), 0]
            self._own.add(str(folder))
        for name in self.schema:
            with open(Path(self._open[0]) / f"{name}.bin", "ab") as f:
                for chunk in self._memory:
                    f.write(chunk[name].tobytes())
        self._open[1] += sum(len(next(iter(c.values()))) for c in self._memory)
        self._memory, self._memory_bytes = [], 0

    @property
    def memory_bytes(self) -> int:
        """Bytes of rows held in memory (not yet on disk)."""
        return self._memory_bytes

    @property
    def persistent(self) -> bool:
        """Whether the shards live in a folder the caller chose (which outlives the process), not a private
        temporary one."""
        return self.workdir is not None and not is_private(self.workdir)

    def flush(self) -> None:
        """Move the rows held in memory to disk and seal the shard: afterwards the store is only its shards."""
        self._spill()
        self.seal()

    def shards(self) -> list[tuple[str, int]]:
        """``(folder, rows)`` of every shard on disk, in store order."""
        return list(self._sealed) + ([(self._open[0], int(self._open[1]))] if self._open else [])

    @classmethod
    def of_shards(cls, workdir: str | Path, schema: Mapping[str, tuple[str, tuple[int, ...]]],
                  shards: list[tuple[str, int]], spill_bytes: int = 64 << 20) -> RowStore:
        """A store of existing sealed shards (what :meth:`flush` and :meth:`shards` left on disk).

        Raises:
            FileNotFoundError: a shard's column file is missing or shorter than its rows.
        """
        store = cls(workdir=workdir, spill_bytes=spill_bytes)
        store.schema = {k: (dtype, tuple(tail)) for k, (dtype, tail) in schema.items()}
        for folder, rows in shards:
            for name, (dtype, tail) in store.schema.items():
                path = Path(folder) / f"{name}.bin"
                need = int(rows) * int(np.prod(tail, dtype=np.int64)) * np.dtype(dtype).itemsize
                if not path.is_file() or path.stat().st_size < need:
                    raise VitscopeFileNotFoundError(f"{path} is missing or shorter than its {rows} rows")
            store._sealed.append((str(folder), int(rows)))
            store.rows += int(rows)
        return store

    def seal(self) -> None:
        """Close the open shard for writing (it may then be shared); later spills open a new one."""
        if self._open is not None:
            self._sealed.append((self._open[0], int(self._open[1])))
            self._open = None

    def extend(self, other: RowStore) -> None:
        """Add every row of ``other`` (its shards are sealed and referenced, its memory rows copied)."""
        if other is self:
            raise VitscopeValueError("cannot extend a RowStore with itself")
        if other.rows == 0:
            return
        if self.schema and other.schema != self.schema:
            raise VitscopeValueError(f"cannot merge stores with different columns: {other.schema} vs {self.schema}")
        other.seal()
        other._copies.wait()
        self.schema = dict(other.schema)
        self._sealed.extend(other._sealed)
        self._memory.extend({k: v.copy() for k, v in chunk.items()} for chunk in other._memory)
        self._memory_bytes += other._memory_bytes
        self.rows += other.rows
        if self._memory_bytes > self.spill_bytes:
            self._spill()

    def export(self, folder: str | Path, max_rows: int = 4096) -> RowStore:
        """A copy of every row in one sealed shard under ``folder``, holding nothing in memory.

        Pickling the copy carries only the shard's path, the row count and the columns, so it can be handed
        to another process that sees ``folder`` (how ``torch.distributed`` ranks share their rows without
        sending them through the process group). Rows are streamed ``max_rows`` at a time.
        """
        out = RowStore(workdir=folder, spill_bytes=self.spill_bytes)
        out.schema = dict(self.schema)
        if self.rows == 0:
            return out
        shard = Path(out._folder()) / f"shard-{uuid.uuid4().hex}"
        shard.mkdir()
        files = {name: open(shard / f"{name}.bin", "wb") for name in self.schema}  # noqa: SIM115
        try:
            for chunk in self.chunks(max_rows=max_rows):
                for name, f in files.items():
                    f.write(np.ascontiguousarray(chunk[name]).tobytes())
        finally:
            for f in files.values():
                f.close()
        out._sealed.append((str(shard), self.rows))
        out.rows = self.rows
        return out

    def linked_copy(self, folder: str | Path | None = None) -> RowStore:
        """A store of the same rows whose shards are new folders under ``folder`` (None: a private temporary
        folder), holding hard links to this store's files (copies where the file system cannot link); rows held
        in memory are written out first.

        The copy owns its links and its files: releasing either store leaves the other's rows intact, linking
        costs no disk space or time whatever the rows' size, and this store writes nothing (its open shard is
        only closed for writing).
        """
        self.seal()
        self._copies.wait()
        out = RowStore(workdir=private_folder() if folder is None else folder, spill_bytes=self.spill_bytes)
        out.schema = dict(self.schema)
        root = out._folder()
        for shard, rows in self.shards():
            target = root / f"shard-{uuid.uuid4().hex}"
            target.mkdir()
            for name in self.schema:
                link_or_copy(Path(shard) / f"{name}.bin", target / f"{name}.bin")
            out._sealed.append((str(target), int(rows)))
            out._own.add(str(target))
            out.rows += int(rows)
        for chunk in self._memory:  # written under ``folder``, as the copy's own shard
            out.append(chunk)
        out.flush()
        return out

    def release(self) -> None:
        """Forget every row and delete the shard files this store wrote itself in a private temporary folder
        (rows another store shares are left on disk; call when no copy of this store will read them again)."""
        if not self.persistent:
            for folder in self._own:
                shutil.rmtree(folder, ignore_errors=True)
        self._own.clear()
        self._sealed, self._open = [], None
        self._memory, self._memory_bytes = [], 0
        self._copies = HostCopies()
        self.rows = 0

    # -- reading -----------------------------------------------------------------------
    def __len__(self) -> int:
        return self.rows

    def _shard_chunk(self, folder: str, rows: int, names: list[str]) -> dict[str, np.ndarray]:
        out = {}
        for name in names:
            dtype, tail = self.schema[name]
            out[name] = np.memmap(Path(folder) / f"{name}.bin", dtype=np.dtype(dtype), mode="r", shape=(rows, *tail))
        return out

    def chunks(self, names: list[str] | None = None, max_rows: int = 4096) -> Iterator[dict[str, np.ndarray]]:
        """Yield the rows in store order as dicts of arrays (disk rows as memory maps, ``max_rows`` at a time)."""
        names = list(self.schema) if names is None else list(names)
        unknown = [n for n in names if n not in self.schema]
        if unknown:
            raise VitscopeKeyError(f"unknown columns {unknown}; the store has {sorted(self.schema)}")
        self._copies.wait()
        for folder, rows in self.shards():
            if rows == 0:
                continue
            maps = self._shard_chunk(folder, rows, names)
            for start in range(0, rows, max_rows):
                yield {k: v[start : start + max_rows] for k, v in maps.items()}
        for chunk in self._memory:
            yield {k: chunk[k] for k in names}

    def column(self, name: str) -> np.ndarray:
        """Every row of one column, in store order, as one in-memory array (use for small columns)."""
        parts = [np.asarray(c[name]) for c in self.chunks([name])]
        if not parts:
            dtype, tail = self.schema.get(name, ("<f4", ()))
            return np.zeros((0, *tail), dtype=np.dtype(dtype))
        return np.concatenate(parts)

    def write_sorted(self, key: str, out: Mapping[str, np.ndarray]) -> np.ndarray:
        """Copy every column into preallocated arrays (e.g. ``np.lib.format.open_memmap``), sorted by ``key``.

        Args:
            key: column whose values order the rows (stable sort).
            out: ``{column: array [rows, *tail]}`` for the columns to write.

        Returns:
            ``order`` such that row ``i`` of the output is row ``order[i]`` of the store.
        """
        order = np.argsort(self.column(key), kind="stable")
        position = np.empty_like(order)
        position[order] = np.arange(order.size)
        offset = 0
        for chunk in self.chunks(list(out)):
            b = len(next(iter(chunk.values())))
            for name, arr in out.items():
                arr[position[offset : offset + b]] = chunk[name]
            offset += b
        return order

    def sorted_column(self, name: str, key: str) -> np.ndarray:
        """One column as an in-memory array sorted (stably) by ``key``."""
        return self.column(name)[np.argsort(self.column(key), kind="stable")]

    # -- pickling ----------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        export_to = export_folder()
        if export_to is not None:  # for another process: every row in one shard file, nothing in the pickle
            return dict(self.export(Path(export_to) / f"rows-{uuid.uuid4().hex}").__dict__, _own=set())
        self.seal()  # a pickled copy may be resumed elsewhere: the shard must not change under it
        self._copies.wait()
        return dict(self.__dict__, _own=set(), _copies=HostCopies())  # a copy shares the files and never deletes them

    def __setstate__(self, state: dict[str, Any]) -> None:
        # stores pickled before ownership existed own nothing
        self.__dict__.update({"_own": set(), "_copies": HostCopies(), **state})


def _dtype_str(value: Any) -> str:
    """The numpy dtype string a column's rows are kept in (a tensor's dtype converted)."""
    if isinstance(value, torch.Tensor):
        return numpy_dtype(value.dtype).str
    return np.asarray(value).dtype.str
