"""Turn accumulator state into a tree that ``torch.load(weights_only=True)`` can read back, and back again.

``Analysis.state_dict()`` holds plain tensors and numbers, but also numpy arrays, sets, dicts with int
keys, small dataclasses (``AttentionGeometry``), helper objects (``MinibatchHSIC``) and disk-backed
``RowStore`` tables. Pickling those would make a state file able to run code when loaded, so instead
:func:`encode` rewrites them as tagged dicts of tensors, strings and numbers (the only things the
weights-only unpickler accepts) and :func:`decode` rebuilds them. Objects are rebuilt only when their class
lives in the ``vitscope`` package; anything else is refused when saving and when loading.

A ``RowStore`` in a folder the caller chose (``persistent``: the feature cache's resumable passes) is saved by
reference: its rows are flushed to sealed shard files, which are never written again, and the state file
names them, so saving stays cheap however many rows there are; a state whose shards are gone cannot be
restored (the run starts over). A store in a private temporary folder, which does not outlive the process,
is saved by value (every row, in store order) while its rows are all in memory; once it has rows on disk,
and the caller gives a ``rows_folder`` beside the state file, its shards are hard-linked there (copied where
links are impossible) and the state file names them: saving costs neither memory nor a copy of the rows,
and loading links them back into a private folder of the restored store.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitscope.errors import VitscopeTypeError

__all__ = ["StateCodecError", "decode", "encode"]

_TAG = "__vs__"
_PACKAGE = "vitscope."


class StateCodecError(VitscopeTypeError):
    """A value cannot be saved in (or was not written as) a resumable state file."""


def _array_to_tree(a: np.ndarray) -> dict[str, Any]:
    a = np.ascontiguousarray(a)
    if a.dtype.hasobject:
        raise StateCodecError("cannot save a numpy array of Python objects in a state file")
    raw = torch.frombuffer(bytearray(a.tobytes()), dtype=torch.uint8) if a.nbytes else torch.zeros(0, dtype=torch.uint8)
    return {_TAG: "ndarray", "dtype": a.dtype.str, "shape": list(a.shape), "data": raw}


def _tree_to_array(tree: dict[str, Any]) -> np.ndarray:
    data = tree["data"]
    buf = data.numpy().tobytes() if data.numel() else b""
    return np.frombuffer(buf, dtype=np.dtype(tree["dtype"])).reshape(tree["shape"]).copy()


def _rowstore_to_tree(store: Any, rows_folder: str | None) -> dict[str, Any]:
    schema = {k: [dtype, list(tail)] for k, (dtype, tail) in store.schema.items()}
    if store.persistent:
        store.flush()
        return {_TAG: "rowstore_ref", "spill_bytes": int(store.spill_bytes), "workdir": str(store.workdir),
                "schema": schema, "shards": [[folder, rows] for folder, rows in store.shards()]}
    if rows_folder is not None and store.shards():
        saved = store.linked_copy(rows_folder)
        return {_TAG: "rowstore_saved", "spill_bytes": int(store.spill_bytes), "schema": schema,
                "shards": [[folder, rows] for folder, rows in saved.shards()]}
    columns = {name: _array_to_tree(store.column(name)) for name in store.schema}
    return {_TAG: "rowstore", "spill_bytes": int(store.spill_bytes), "columns": columns,
            "schema": {k: [dtype, list(tail)] for k, (dtype, tail) in store.schema.items()}}


def _tree_to_rowstore(tree: dict[str, Any]) -> Any:
    from vitscope.cache.rowstore import RowStore

    store = RowStore(spill_bytes=int(tree["spill_bytes"]))
    columns = {k: _tree_to_array(v) for k, v in tree["columns"].items()}
    if columns and len(next(iter(columns.values()))):
        store.append(columns)
    else:  # an empty store still remembers its columns
        store.schema = {k: (dtype, tuple(tail)) for k, (dtype, tail) in tree["schema"].items()}
    return store


def _saved_rowstore(tree: dict[str, Any]) -> Any:
    """The rows a state file's folder holds, linked into a private folder of a new store (the folder is replaced
    at the next save, and the restored store may release its rows)."""
    from vitscope.cache.rowstore import RowStore

    shards = [(str(f), int(r)) for f, r in tree["shards"]]
    schema = {k: (d, tuple(t)) for k, (d, t) in tree["schema"].items()}
    try:
        saved = RowStore.of_shards(str(Path(shards[0][0]).parent), schema, shards,
                                   int(tree["spill_bytes"]))
    except FileNotFoundError as err:
        raise StateCodecError(f"the saved rows are gone ({err})") from None
    return saved.linked_copy()


def _class_path(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}:{cls.__qualname__}"


def _import_class(path: str) -> type:
    module, _, qualname = path.partition(":")
    if not (module + ".").startswith(_PACKAGE):
        raise StateCodecError(f"refusing to rebuild {path!r} from a state file: only vitscope classes are allowed")
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    if not isinstance(target, type):
        raise StateCodecError(f"{path!r} in a state file is not a class")
    return target


def encode(value: Any, rows_folder: str | os.PathLike | None = None) -> Any:
    """Rewrite ``value`` as nested dicts/lists of tensors, str, int, float, bool and None.

    Args:
        value: the state to encode.
        rows_folder: where row stores with rows on disk are linked (see the module docstring); None: by value.

    Raises:
        StateCodecError: a value of a type that cannot be saved (e.g. a lambda or an object from another
            package).
    """
    from vitscope.cache.rowstore import RowStore

    if value is None or type(value) in (bool, int, float, str):  # exact types: np.float64 subclasses float
        return value
    if isinstance(value, np.generic):
        return {_TAG: "npscalar", "value": _array_to_tree(np.asarray(value))}
    if isinstance(value, (bool, int, float, str)):  # other subclasses (IntEnum...): the plain value
        return next(t for t in (bool, int, float, str) if isinstance(value, t))(value)
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, np.ndarray):
        return _array_to_tree(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        kind = type(value).__name__ if type(value) in (list, tuple, set, frozenset) else "list"
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return {_TAG: kind, "items": [encode(v, rows_folder) for v in items]}
    if isinstance(value, dict):
        return {_TAG: "dict", "items": [[encode(k, rows_folder), encode(v, rows_folder)] for k, v in value.items()]}
    if isinstance(value, torch.dtype):
        return {_TAG: "dtype", "name": str(value).removeprefix("torch.")}
    if isinstance(value, RowStore):
        return _rowstore_to_tree(value, None if rows_folder is None else str(rows_folder))
    if type(value).__module__.startswith(_PACKAGE) and hasattr(value, "__dict__"):
        return {_TAG: "object", "class": _class_path(value), "state": encode(dict(vars(value)), rows_folder)}
    raise StateCodecError(f"cannot save a {type(value).__module__}.{type(value).__qualname__} in a state file")


def decode(tree: Any) -> Any:
    """Inverse of :func:`encode`.

    Raises:
        StateCodecError: an unknown tag, or an object class outside the vitscope package.
    """
    if not isinstance(tree, dict):
        return tree
    kind = tree.get(_TAG)
    if kind == "ndarray":
        return _tree_to_array(tree)
    if kind == "npscalar":
        return _tree_to_array(tree["value"])[()]
    if kind in ("list", "tuple", "set", "frozenset"):
        items = [decode(v) for v in tree["items"]]
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[kind](items)
    if kind == "dict":
        return {decode(k): decode(v) for k, v in tree["items"]}
    if kind == "dtype":
        dtype = getattr(torch, str(tree["name"]), None)
        if not isinstance(dtype, torch.dtype):  # never hand back another torch attribute
            raise StateCodecError(f"{tree['name']!r} in a state file is not a torch dtype")
        return dtype
    if kind == "rowstore":
        return _tree_to_rowstore(tree)
    if kind == "rowstore_ref":
        from vitscope.cache.rowstore import RowStore

        try:
            return RowStore.of_shards(tree["workdir"], {k: (d, tuple(t)) for k, (d, t) in tree["schema"].items()},
                                      [(str(f), int(r)) for f, r in tree["shards"]], int(tree["spill_bytes"]))
        except FileNotFoundError as err:
            raise StateCodecError(f"the saved rows are gone ({err})") from None
    if kind == "rowstore_saved":
        return _saved_rowstore(tree)
    if kind == "object":
        cls = _import_class(tree["class"])
        obj = cls.__new__(cls)
        obj.__dict__.update(decode(tree["state"]))  # not setattr: frozen dataclasses forbid it
        return obj
    raise StateCodecError(f"unknown entry {kind!r} in a state file (written by another vitscope version?)")
