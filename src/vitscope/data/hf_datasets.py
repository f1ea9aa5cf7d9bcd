"""Hugging Face ``datasets`` as a :class:`~vitscope.data.source.Source`: ``ROOT::hf[:SPLIT]`` or a ``Dataset`` /
``DatasetDict`` object.

Three layouts on disk, read lazily and without the network:

* ``save_to_disk`` of a ``Dataset`` (``state.json`` + Arrow files) or of a ``DatasetDict`` (``dataset_dict.json``
  and one folder per split): memory-mapped through ``datasets.load_from_disk``;
* Parquet files, as the hub's ``imagenet-1k`` ships them (``data/train-00000-of-00294.parquet``, or
  ``train/*.parquet``): read row group by row group with ``pyarrow`` (``datasets`` would first copy them into its
  cache, 150 GB for ImageNet).

The image column is the first ``Image`` feature (encoded bytes, decoded here with PIL), the label column the
``ClassLabel`` feature named ``label`` (or ``labels``), else the first in the features' order (CIFAR-100's
``fine_label`` before its ``coarse_label``); its names are the class names and ``-1`` is "no label". ``:SPLIT``
picks a split; without one the only split, else ``validation``/``val``/``test``, is read. Parquet files are split by
their names (``<split>-00000-of-00004.parquet``, as the hub writes them, in ``data/`` or a configuration's folder),
else by their folder (``<split>/*.parquet``), else by the name before its first ``-`` or ``.parquet``
(``train.parquet``). A single saved dataset (not a dictionary) takes ``:SPLIT`` only when it names its own split.
Rows are read as Python values whatever output format an object was given (``with_format``). The fingerprint reads
no image: the Arrow or Parquet files' sizes and times, with ``datasets``' own fingerprint of an object (which
follows ``select``, ``shuffle``, ``filter``: another selection of the same files is another dataset).
"""

from __future__ import annotations

import bisect
import hashlib
import io
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from vitscope.data.formats.errors import DatasetFormatError
from vitscope.data.images import ImageLoadError, decode_rgb
from vitscope.data.source import Source

__all__ = ["HFDatasetSource", "is_hf_dataset", "open_hf"]

#: splits read when none is named and there are several (in this order)
_DEFAULT_SPLITS = ("validation", "val", "test")


def _datasets():
    try:
        import datasets
    except ImportError:
        raise DatasetFormatError("reading Hugging Face datasets needs the datasets package: pip install "
                                 "'vitscope[hf]' (or pip install datasets)") from None
    return datasets


def is_hf_dataset(data: Any) -> bool:
    """Whether ``data`` is a ``datasets.Dataset`` or ``DatasetDict`` (without importing ``datasets``)."""
    return type(data).__module__.startswith("datasets.") and type(data).__name__ in ("Dataset", "DatasetDict")


def _pick_split(splits: Sequence[str], split: str | None, where: str, advice: str | None = None) -> str:
    """The split to read: ``split``, else the only one, else the first of :data:`_DEFAULT_SPLITS` held.

    Args:
        splits: the splits held; where: what the message calls the data.
        advice: how to choose one when none is found (default: ``--data WHERE::hf:SPLIT``).
    """
    if split is not None:
        if split not in splits:
            raise DatasetFormatError(f"{where} has no split {split!r}; its splits: {', '.join(splits)}")
        return split
    if len(splits) == 1:
        return splits[0]
    for name in _DEFAULT_SPLITS:
        if name in splits:
            return name
    raise DatasetFormatError(f"{where} holds the splits {', '.join(splits)}; "
                             f"{advice or f'choose one with --data {where}::hf:SPLIT'}")


def _columns(features: Any) -> tuple[str, str | None, list[str] | None]:
    """``(image column, label column or None, class names or None)`` from ``datasets`` features."""
    datasets = _datasets()
    images = [n for n, f in features.items() if isinstance(f, datasets.Image)]
    if not images:
        raise DatasetFormatError(f"no image column (an Image feature) among {', '.join(features)}")
    labels = sorted((n for n, f in features.items() if isinstance(f, datasets.ClassLabel)),
                    key=lambda n: n not in ("label", "labels"))  # stable: the features' order otherwise
    label = labels[0] if labels else None
    return images[0], label, (list(features[label].names) if label else None)


def _label_advice(features: Any) -> str | None:
    """Why a dataset without a ClassLabel column has no labels, when a column named like one holds other values."""
    for name in ("label", "labels", "class", "target"):
        feature = features.get(name)
        if feature is not None:
            kind = getattr(feature, "dtype", type(feature).__name__)
            return (f"its column {name!r} holds {kind} values, not a ClassLabel feature, which is where labels and "
                    f"class names are read: cast it and save the dataset again (dataset.class_encode_column({name!r}) "
                    f"for strings, dataset.cast_column({name!r}, datasets.ClassLabel(names=[...])) for integers)")
    return None


class _ParquetRows:
    """Rows of Parquet files by position, read one row group at a time (the last one read is kept)."""

    def __init__(self, files: list[Path]) -> None:
        _datasets()  # pyarrow comes with it: one line naming the extra when it is missing
        import pyarrow.parquet as pq

        self.files = files
        self._starts: list[int] = []  # first row of every (file, row group)
        self._groups: list[tuple[int, int]] = []
        total = 0
        for k, f in enumerate(files):
            meta = pq.ParquetFile(f).metadata
            for g in range(meta.num_row_groups):
                self._starts.append(total)
                self._groups.append((k, g))
                total += meta.row_group(g).num_rows
        self.num_rows = total
        self._cached: tuple[int, Any] | None = None
        self.columns: list[str] | None = None  # what a row read brings (set by the source)
        self.schema = pq.ParquetFile(files[0]).schema_arrow if files else None

    def row(self, i: int, columns: list[str]) -> dict[str, Any]:
        import pyarrow.parquet as pq

        g = bisect.bisect_right(self._starts, i) - 1
        cached = self._cached  # read once: another thread may replace it between a check and a use
        if cached is None or cached[0] != g:  # the image and label columns together: read once
            k, group = self._groups[g]
            cached = self._cached = (g, pq.ParquetFile(self.files[k]).read_row_group(group, columns=self.columns))
        table = cached[1]
        return {c: table.column(c)[i - self._starts[g]].as_py() for c in columns}

    def column(self, name: str) -> np.ndarray:
        import pyarrow.parquet as pq

        # to_pylist keeps a null a None (numpy would make an integer column with nulls float, the null NaN)
        values = [v for f in self.files for v in pq.ParquetFile(f).read(columns=[name]).column(name).to_pylist()]
        return np.asarray(values, dtype=object)


def _parquet_features(schema: Any) -> Any:
    """The ``datasets`` features a Parquet file written by ``datasets`` records in its schema metadata."""
    datasets = _datasets()
    meta = (schema.metadata or {}).get(b"huggingface")
    if meta is None:
        raise DatasetFormatError("these Parquet files carry no Hugging Face features (schema metadata "
                                 "'huggingface'): write them with datasets' to_parquet or push_to_hub")
    return datasets.Features.from_dict(json.loads(meta)["info"]["features"])


#: the hub's shard names: ``train-00000-of-00294.parquet``
_SHARD_NAME = re.compile(r"^(?P<split>[\w.]+?)-\d{5}-of-\d{5}\.parquet$")


def _parquet_splits(root: Path) -> dict[str, list[Path]]:
    """``split -> files`` of a folder of Parquet files: named ``<split>-00000-of-0000N.parquet`` (in ``data/`` or a
    configuration's folder), else ``<split>/*.parquet``, else ``<split>.parquet`` or ``<split>-<anything>.parquet``.

    Raises:
        DatasetFormatError: one split in several folders (configurations of one dataset): the root must be one.
    """
    found: dict[str, list[Path]] = {}
    folders: dict[str, set[Path]] = {}
    for f in sorted(root.rglob("*.parquet")):
        rel = f.relative_to(root).parts
        named = _SHARD_NAME.match(f.name)
        split = named["split"] if named else rel[-2] if len(rel) >= 2 and rel[-2] != "data" else \
            f.name.removesuffix(".parquet").split("-", 1)[0]
        found.setdefault(split, []).append(f)
        folders.setdefault(split, set()).add(f.parent)
    mixed = {split: sorted(str(p.relative_to(root)) for p in where) for split, where in folders.items()
             if len(where) > 1}
    if mixed:
        split, where = next(iter(mixed.items()))
        raise DatasetFormatError(f"{root} holds the split {split!r} in several folders ({', '.join(where)}): "
                                 "configurations of one dataset; give the folder of one of them")
    return found


class _RowNames(Sequence):
    """``name[i]`` on demand: a million-row split keeps no list of names."""

    def __init__(self, name: str, n: int) -> None:
        self.name, self.n = name, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        if not -self.n <= i < self.n:
            raise IndexError(f"{self.name}: row {i} out of range for {self.n} rows")
        return f"{self.name}[{i % self.n}]"


class HFDatasetSource(Source):
    """One split of a Hugging Face dataset (module docstring).

    Args:
        rows: ``datasets.Dataset`` (images not decoded by it), or the Parquet reader.
        features: its ``datasets`` features.
        name: what results.json calls the data.
        files: the Arrow or Parquet files behind it (stat signatures fingerprint it), or None to use
            ``fingerprint`` instead.
        fingerprint: ``datasets``' own fingerprint of an object in memory.
        strict: :meth:`get` raises on unreadable images.
        split: the split read (None: the data names none).
        origin: where it was read from (its folder), as results.json records it.
    """

    def __init__(self, rows: Any, features: Any, name: str, files: list[str] | None = None,
                 fingerprint: str | None = None, strict: bool = False, split: str | None = None,
                 origin: str = "a datasets object in memory") -> None:
        super().__init__(strict=strict)
        self.name, self.split, self.origin = name, split, origin
        self._rows, self._files, self._fingerprint = rows, files, fingerprint
        self.image_column, self.label_column, self.class_names = _columns(features)
        self.label_advice = None if self.label_column else _label_advice(features)
        if isinstance(rows, _ParquetRows):
            rows.columns = [c for c in (self.image_column, self.label_column) if c is not None]
        n = rows.num_rows if hasattr(rows, "num_rows") else len(rows)
        self.paths = _RowNames(name, n)

    def _row(self, i: int, columns: list[str]) -> dict[str, Any]:
        if isinstance(self._rows, _ParquetRows):
            return self._rows.row(i, columns)
        item = self._rows[int(i)]
        return {c: item[c] for c in columns}

    def load(self, i: int) -> Image.Image:
        value = self._row(i, [self.image_column])[self.image_column]
        data = value.get("bytes") if isinstance(value, dict) else None
        if data is None and isinstance(value, dict) and value.get("path"):
            if not Path(value["path"]).is_file():
                raise ImageLoadError(self.path(i), f"the row holds no image bytes, and its path {value['path']} is "
                                     "not a file")
            data = Path(value["path"]).read_bytes()
        if data is None:
            raise ImageLoadError(self.path(i), "the row holds no image bytes")
        return decode_rgb(io.BytesIO(data), self.path(i))

    def targets(self, i: int) -> dict[str, Any]:
        if self.label_column is None:
            return {}
        label = self._row(i, [self.label_column])[self.label_column]
        return {} if label is None or int(label) < 0 else {"label": int(label)}

    def labels(self) -> np.ndarray:
        if self.label_column is None:
            raise self._no_labels()
        if isinstance(self._rows, _ParquetRows):
            values = self._rows.column(self.label_column)
        else:
            values = np.asarray(self._rows[self.label_column])
        out = np.asarray([-1 if v is None else int(v) for v in values], dtype=np.int64)
        if not len(out) or (out < 0).all():
            raise self._no_labels()
        return out

    def fingerprint_files(self) -> tuple[Sequence[str], Path] | None:
        if not self._files:
            return None
        return list(self._files), Path(self._files[0]).parent

    def _datasets_digest(self) -> str:
        """SHA-256 of ``datasets``' own fingerprint of the object (its history: ``select``, ``shuffle``...)."""
        return hashlib.sha256(f"datasets:{self._fingerprint}".encode()).hexdigest()

    def memory_digest(self) -> str | None:
        """``datasets``' fingerprint of the object: which rows of its files, in which order (``select``...)."""
        return self._datasets_digest() if self._fingerprint is not None and self._files else None

    def content_digest(self) -> str:
        if self._fingerprint is not None:  # an object without files: no image is decoded
            return self._datasets_digest()
        return super().content_digest()

    def describe(self) -> dict[str, Any]:
        out = {**super().describe(), "source": self.origin, "format": "hf", "image_column": self.image_column}
        if self.split is not None:
            out["split"] = self.split
        if self.label_column is None:
            return {**out, "label_rule": "none: the data has no ClassLabel column"}
        out.update({"label_column": self.label_column, "num_classes": len(self.class_names or []),
                    "label_rule": f"the ClassLabel column {self.label_column!r} (-1: no label)"})
        if self.class_names:
            out["classes"] = [str(c) for c in self.class_names]
        return out


def _from_object(data: Any, split: str | None, name: str, strict: bool, root: Path | None = None) -> HFDatasetSource:
    """A source of a ``Dataset``, or of one split of a ``DatasetDict``: an object from Python, or loaded from
    ``root``."""
    datasets = _datasets()
    if isinstance(data, datasets.DatasetDict):
        # an object from Python has no --data spec to name a split in: one split of it is passed instead
        advice = None if root is not None else f'pass one split of it, e.g. dd["{next(iter(data), "train")}"]'
        chosen = _pick_split(list(data), split, str(root) if root is not None else name, advice)
        data, name = data[chosen], f"{name}:{chosen}"
        split = chosen
    elif split is not None and str(data.split) != split:  # one dataset: a split asked for must be its own
        held = f"the split {str(data.split)!r}" if data.split is not None else "no named split"
        raise DatasetFormatError(f"{name} is one dataset with {held}, not a dataset dictionary: it has no split "
                                 f"{split!r}; leave out ':{split}'")
    image, _, _ = _columns(data.features)
    fingerprint = data._fingerprint
    # rows as dicts of Python values, whatever output format the object was given (pandas, arrow, torch...)
    rows = data.with_format(None).cast_column(image, datasets.Image(decode=False))  # bytes, decoded here by PIL
    files = [f["filename"] for f in data.cache_files] or None
    held = split if split is not None else (str(data.split) if data.split is not None else None)
    origin = str(root) if root is not None else "a datasets object in memory"
    return HFDatasetSource(rows, data.features, name, files=files, fingerprint=fingerprint, strict=strict,
                           split=held, origin=origin)


def open_hf(data: Any, split: str | None = None, strict: bool = False) -> HFDatasetSource:
    """A Source of a Hugging Face dataset: a folder (``save_to_disk`` or Parquet files) or an object.

    Raises:
        DatasetFormatError: no such folder, no image column, an unknown split (the message lists the splits),
            or ``datasets`` is not installed.
    """
    if is_hf_dataset(data):
        return _from_object(data, split, "hf-dataset", strict)
    root = Path(data)
    if not root.is_dir():
        raise DatasetFormatError(f"Hugging Face dataset folder '{root}' does not exist")
    if (root / "dataset_dict.json").is_file() or (root / "state.json").is_file():
        return _from_object(_datasets().load_from_disk(str(root)), split, root.name, strict, root)
    splits = _parquet_splits(root)
    if not splits:
        raise DatasetFormatError(f"{root} holds neither a saved Hugging Face dataset (state.json, dataset_dict.json) "
                                 "nor Parquet files")
    chosen = _pick_split(sorted(splits), split, str(root))
    rows = _ParquetRows(splits[chosen])
    return HFDatasetSource(rows, _parquet_features(rows.schema), f"{root.name}:{chosen}",
                           files=[str(f) for f in splits[chosen]], strict=strict, split=chosen, origin=str(root))
