"""Revisited Oxford / Paris retrieval benchmarks: writer, safe loader and lazy reader.

Layout (as the official ``revisitop`` release)::

    root/jpg/<name>.jpg
    root/gnd_<dataset>.pkl   {"imlist": [db names], "qimlist": [query names],
                              "gnd": [{"bbx": [x1, y1, x2, y2], "easy": [...], "hard": [...], "junk": [...]}]}

``easy``/``hard``/``junk`` are indices into ``imlist`` (lists or numpy arrays, both occur). ``bbx`` is
a float pixel box used by ``PIL.Image.crop``, i.e. already our ``[x1, y1, x2, y2]`` convention with
x2/y2 exclusive: it is read unchanged. Pickles are loaded with a restricted unpickler that resolves
only containers, numbers, strings and numpy arrays; anything else is refused before it can run.

Synthetic relevance rule (``write_revisitop``): a query's target is the instance of its main
(largest visible) object. For a database image, ``r`` = visible pixels of that instance in the image
(summed over its occurrences) / its visible pixels in the query. ``r >= easy_min`` (0.6) -> easy,
``junk_max <= r < easy_min`` (0.2) -> hard, ``0 < r < junk_max`` -> junk (too little of it shows to
judge), ``r == 0`` (absent or fully occluded) -> negative. Other instances of the same class are
negatives, as other buildings are in the revisited protocol.
"""

from __future__ import annotations

import builtins
import importlib
import os
import pickle
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

import numpy as np

from vitscope.atomic import atomic_path
from vitscope.data.formats.common import DatasetFileNotFoundError, LazyDataset, save_jpeg
from vitscope.data.formats.errors import DatasetFormatError, safe_join
from vitscope.data.items import AnnotatedImage, RetrievalGroundTruth
from vitscope.data.synthetic.scene import Scene

__all__ = ["RevisitOPDataset", "load_gnd", "write_revisitop"]

LEVELS = ("easy", "medium", "hard")
_SAFE_BUILTINS = frozenset(
    {"set", "frozenset", "list", "dict", "tuple", "int", "float", "complex", "bool", "str", "bytes", "bytearray"}
)
_NUMPY_GLOBALS = frozenset(
    {("numpy", "ndarray"), ("numpy", "dtype")}
    | {(f"numpy.{core}.multiarray", n) for core in ("core", "_core") for n in ("_reconstruct", "scalar")}
    | {(f"numpy.{core}.numeric", "_frombuffer") for core in ("core", "_core")}
)


def _latin1_encode(text: str, encoding: str = "utf-8") -> bytes:
    """``_codecs.encode`` as protocol-2 pickles use it for bytes, limited to latin-1."""
    if encoding.replace("-", "").replace("_", "").lower() not in ("latin1", "iso88591"):
        raise pickle.UnpicklingError(f"refusing _codecs.encode with encoding {encoding!r}")
    return str(text).encode("latin-1")


class _RestrictedUnpickler(pickle.Unpickler):
    """Resolves only builtin containers/scalars and what numpy arrays and scalars need."""

    def __init__(self, file: IO[bytes], source: str) -> None:
        super().__init__(file)
        self._source = source

    def find_class(self, module: str, name: str) -> Callable | type:
        mod = "builtins" if module == "__builtin__" else module
        if mod == "builtins" and name in _SAFE_BUILTINS:
            return getattr(builtins, name)
        if mod == "_codecs" and name == "encode":
            return _latin1_encode
        if (mod, name) in _NUMPY_GLOBALS:
            # numpy 2 renamed numpy.core to numpy._core (the old name warns); numpy 1 has only the old one
            for candidate in (mod.replace("numpy.core.", "numpy._core."), mod.replace("numpy._core.", "numpy.core.")):
                try:
                    return getattr(importlib.import_module(candidate), name)
                except (ImportError, AttributeError):
                    continue
        raise DatasetFormatError(
            f"refusing to unpickle {module}.{name} from {self._source}: "
            "only containers, numbers, strings and numpy arrays are allowed"
        )


def load_gnd(path: str | os.PathLike) -> dict:
    """Load a revisitop ground-truth pickle without executing code from it.

    Raises:
        DatasetFormatError: missing/corrupt file, or a pickle that references anything other than
            containers, numbers, strings and numpy arrays.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetFormatError(f"ground-truth file {path} not found")
    try:
        with open(path, "rb") as f:
            data = _RestrictedUnpickler(f, str(path)).load()
    except DatasetFormatError:
        raise
    except Exception as err:  # corrupt pickles raise many exception types
        raise DatasetFormatError(f"cannot unpickle {path}: {type(err).__name__}: {err}") from err
    if not isinstance(data, dict):
        raise DatasetFormatError(f"{path}: expected a dict with imlist, qimlist and gnd")
    return data


def _indices(value: object, n_db: int, key: str, where: str) -> np.ndarray:
    try:
        arr = np.asarray(value if value is not None else [], dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as err:
        raise DatasetFormatError(f"{where}: {key!r} must be a list of database indices") from err
    if arr.size and (not np.all(arr == np.round(arr)) or arr.min() < 0 or arr.max() >= n_db):
        raise DatasetFormatError(f"{where}: {key!r} has indices outside 0..{n_db - 1} or non-integers")
    return arr.astype(np.int64)


def _parse_gnd(data: dict, path: Path) -> tuple[list[str], list[str], list[RetrievalGroundTruth]]:
    missing = [k for k in ("imlist", "qimlist", "gnd") if k not in data]
    if missing:
        raise DatasetFormatError(f"{path}: missing keys {missing}")
    imlist, qimlist, gnd = (list(data[k]) for k in ("imlist", "qimlist", "gnd"))
    for key, names in (("imlist", imlist), ("qimlist", qimlist)):
        bad = next((i for i, s in enumerate(names) if not isinstance(s, str)), None)
        if bad is not None:
            raise DatasetFormatError(f"{path}: {key}[{bad}] is not a string")
    if len(gnd) != len(qimlist):
        raise DatasetFormatError(f"{path}: {len(gnd)} gnd entries for {len(qimlist)} queries")
    out = []
    for q, g in enumerate(gnd):
        where = f"query {q} of {path}"
        if not isinstance(g, dict):
            raise DatasetFormatError(f"{where}: gnd entry must be a dict")
        bbx = g.get("bbx")
        if bbx is not None:
            bbx = np.asarray(bbx, dtype=np.float32).reshape(-1)
            if bbx.shape != (4,):
                raise DatasetFormatError(f"{where}: 'bbx' must be [x1, y1, x2, y2]")
        ind = {k: _indices(g.get(k), len(imlist), k, where) for k in ("easy", "hard", "junk")}
        out.append(RetrievalGroundTruth(bbx=bbx, **ind))
    return imlist, qimlist, out


class _ImageList(LazyDataset):
    """Lazy list of ``AnnotatedImage`` for names under ``root/jpg``; files are checked on access."""

    def __init__(self, dataset: RevisitOPDataset, names: list[str], role: str) -> None:
        super().__init__(dataset.root, f"{dataset.name}:{role}")
        self._ds, self._names, self._role = dataset, names, role

    def __len__(self) -> int:
        return len(self._names)

    def _get(self, i: int) -> AnnotatedImage:
        name = self._names[i]
        path = safe_join(self._ds.root / "jpg", f"{name}.jpg", f"{self._role} list of {self._ds.gnd_file}")
        if not path.is_file():
            raise DatasetFileNotFoundError(f"image file {path} ({self._role} {i} of {self._ds.gnd_file}) not found")
        meta = {"name": name, "role": self._role, "index": i}
        boxes = None
        if self._role == "query":
            bbx = self._ds.gnd[i].bbx
            meta["bbx"] = None if bbx is None else bbx.copy()
            boxes = None if bbx is None else bbx[None].copy()
        return AnnotatedImage(image_path=str(path), boxes=boxes, meta=meta)


class RevisitOPDataset(LazyDataset):
    """Lazy reader of a revisited Oxford / Paris benchmark.

    The dataset itself is the queries followed by the database (``len = n_queries + n_database``),
    handy for extracting every feature in one pass; ``.queries`` and ``.database`` are the two lazy
    lists, and ``.gnd`` the per-query ground truth. ``meta`` of each item holds ``name``, ``role``
    (``"query"``/``"database"``), ``index`` within its list and, for queries, ``bbx``.

    Args:
        root: folder holding ``jpg/`` and ``gnd_<name>.pkl``.
        name: dataset name, e.g. ``"roxford5k"``; default: the single ``gnd_*.pkl`` in ``root``.
    """

    def __init__(self, root: str | os.PathLike, name: str | None = None) -> None:
        self.root = Path(root)
        if name is None:
            found = sorted(self.root.glob("gnd_*.pkl"))
            if len(found) != 1:
                raise DatasetFormatError(f"expected exactly one gnd_<name>.pkl in {self.root}, found {len(found)}")
            name = found[0].stem[len("gnd_") :]
        self.name = name
        self.gnd_file = safe_join(self.root, f"gnd_{name}.pkl", "dataset name")
        imlist, qimlist, self.gnd = _parse_gnd(load_gnd(self.gnd_file), self.gnd_file)
        self.queries = _ImageList(self, qimlist, "query")
        self.database = _ImageList(self, imlist, "database")

    def protocol(self, level: str) -> list[dict[str, np.ndarray]]:
        """Positives and junk of every query under the revisited protocol (docs/methods.md, Probes per block).

        Easy: ok = easy, junk = junk + hard. Medium: ok = easy + hard, junk = junk.
        Hard: ok = hard, junk = junk + easy.

        Returns:
            One ``{"ok": int64 [n_ok], "junk": int64 [n_junk]}`` per query.
        """
        level = level.lower()
        if level not in LEVELS:
            raise DatasetFormatError(f"unknown protocol level {level!r}; choose one of {LEVELS}")
        out = []
        for g in self.gnd:
            if level == "easy":
                ok, junk = [g.easy], [g.junk, g.hard]
            elif level == "medium":
                ok, junk = [g.easy, g.hard], [g.junk]
            else:
                ok, junk = [g.hard], [g.junk, g.easy]
            out.append({"ok": np.concatenate(ok).astype(np.int64), "junk": np.concatenate(junk).astype(np.int64)})
        return out

    def __len__(self) -> int:
        return len(self.queries) + len(self.database)

    def _get(self, i: int) -> AnnotatedImage:
        nq = len(self.queries)
        return self.queries[i] if i < nq else self.database[i - nq]

    def __repr__(self) -> str:
        return f"RevisitOPDataset(root={str(self.root)!r}, name={self.name!r}, queries={len(self.queries)})"


def _instance_area(scene: Scene, instance_id: int) -> int:
    return int(sum(np.count_nonzero(o.mask) for o in scene.objects if o.instance_id == instance_id))


def write_revisitop(
    queries: Sequence[Scene],
    database: Sequence[Scene],
    root: str | os.PathLike,
    name: str = "roxford5k-synth",
    easy_min: float = 0.6,
    junk_max: float = 0.2,
) -> Path:
    """Write a synthetic retrieval benchmark in the revisitop layout (relevance rule: module docstring).

    Queries are ``q_0000``..., database images ``db_00000``...; queries are not in the database.
    The query ``bbx`` is the box of its main object.

    Returns:
        The path of the written ``gnd_<name>.pkl``.
    """
    if not 0 < junk_max <= easy_min:
        raise DatasetFormatError(f"need 0 < junk_max <= easy_min, got junk_max={junk_max}, easy_min={easy_min}")
    root = Path(root)
    (root / "jpg").mkdir(parents=True, exist_ok=True)
    qimlist = [f"q_{i:04d}" for i in range(len(queries))]
    imlist = [f"db_{i:05d}" for i in range(len(database))]
    for names, scenes in ((qimlist, queries), (imlist, database)):
        for n, s in zip(names, scenes):
            save_jpeg(np.asarray(s.image, dtype=np.uint8), root / "jpg" / f"{n}.jpg")
    gnd = []
    for q, scene in enumerate(queries):
        areas = [np.count_nonzero(o.mask) for o in scene.objects]
        if not areas or max(areas) == 0:
            raise DatasetFormatError(f"query scene {q} has no visible object")
        main = scene.objects[int(np.argmax(areas))]
        q_area = _instance_area(scene, main.instance_id)
        rel: dict[str, list[int]] = {"easy": [], "hard": [], "junk": []}
        for j, db in enumerate(database):
            r = _instance_area(db, main.instance_id) / q_area
            if r >= easy_min:
                rel["easy"].append(j)
            elif r >= junk_max:
                rel["hard"].append(j)
            elif r > 0:
                rel["junk"].append(j)
        gnd.append({"bbx": [float(v) for v in np.asarray(main.box, dtype=np.float32)], **rel})
    path = safe_join(root, f"gnd_{name}.pkl", "dataset name")
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        pickle.dump({"gnd": gnd, "imlist": imlist, "qimlist": qimlist}, f, protocol=2)
    return path
