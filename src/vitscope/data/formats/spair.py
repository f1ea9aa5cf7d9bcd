"""SPair-71k semantic keypoint correspondence: writer and lazy reader.

Layout (as the official release)::

    root/JPEGImages/<category>/<image>.jpg
    root/ImageAnnotation/<category>/<image>.json     filename, category, image_width, image_height,
                                                      image_depth, bndbox, kps {"0": [x, y] | null, ...}
    root/PairAnnotation/{trn,val,test}/<pair_id>-<src>-<trg>:<category>.json
    root/Layout/large/{trn,val,test}.txt             one pair-file stem per line

A pair file holds ``pair_id``, ``filename``, ``src_imname``, ``trg_imname``, ``src_imsize`` and
``trg_imsize`` (``[width, height, depth]``), ``src_bndbox``, ``trg_bndbox``, ``category``,
``src_kps``/``trg_kps`` (``[[x, y], ...]``: only the keypoints visible in both images, row k of one
matching row k of the other), ``kps_ids`` (their keypoint ids) and the difficulty flags
(``viewpoint_variation``, ``scale_variation``, ``truncation``, ``occlusion``, ``mirror``).

Box convention: SPair ``bndbox`` is ``[xmin, ymin, xmax, ymax]`` in integer pixels. We read it
*unchanged* as our ``[x1, y1, x2, y2]`` with ``x2 = xmax`` treated as exclusive (no +1). This keeps
``max(x2 - x1, y2 - y1)``, the PCK normaliser, equal to the ``max(xmax - xmin, ymax - ymin)`` the
official evaluation code computes. The writer stores our box unchanged, so write -> read is exact.
Keypoints are ``(x, y)`` pixels, unchanged in both directions.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vitscope.atomic import write_text_atomic
from vitscope.data.formats.common import DatasetFileNotFoundError, LazyDataset, save_jpeg
from vitscope.data.formats.errors import DatasetFormatError, safe_join
from vitscope.data.items import ImagePair
from vitscope.data.synthetic.scene import ClassSpec, Scene

__all__ = ["SPairDataset", "write_spair"]

SPLITS = ("trn", "val", "test")
_PAIR_KEYS = ("src_imname", "trg_imname", "src_kps", "trg_kps", "src_bndbox", "trg_bndbox", "category")
_META_KEYS = (
    "pair_id", "filename", "src_imsize", "trg_imsize", "kps_ids", "viewpoint_variation",
    "scale_variation", "truncation", "occlusion", "mirror",
)  # fmt: skip


def _num(v: float) -> int | float:
    """JSON number: ints stay ints (as in the real files), other floats keep float32 precision."""
    f = float(v)
    return int(f) if f.is_integer() else f


def _write_image(scene: Scene, root: Path, category: str, names: dict[int, str]) -> str:
    """Write the JPEG and the ImageAnnotation JSON of ``scene`` once; return its file name."""
    if id(scene) in names:
        return names[id(scene)]
    taken = set(names.values())
    stem, k = f"{scene.index:06d}", 0
    while f"{stem}.jpg" in taken:
        k += 1
        stem = f"{scene.index:06d}_{k}"
    imname = f"{stem}.jpg"
    names[id(scene)] = imname
    obj = scene.objects[0]
    h, w = scene.image.shape[:2]
    (root / "JPEGImages" / category).mkdir(parents=True, exist_ok=True)
    (root / "ImageAnnotation" / category).mkdir(parents=True, exist_ok=True)
    save_jpeg(np.asarray(scene.image, dtype=np.uint8), root / "JPEGImages" / category / imname)
    kps = np.asarray(obj.keypoints, dtype=np.float32).reshape(-1, 3)
    ann = {
        "filename": imname,
        "src_database": "vitscope-synthetic",
        "annotation": "vitscope",
        "image_width": w,
        "image_height": h,
        "image_depth": 3,
        "category": category,
        "pose": "Unspecified",
        "truncated": 0,
        "occluded": 0,
        "difficult": 0,
        "bndbox": [_num(v) for v in np.asarray(obj.box, dtype=np.float32)],
        "kps": {str(j): ([_num(x), _num(y)] if vis > 0 else None) for j, (x, y, vis) in enumerate(kps)},
        "azimuth_id": 0,
    }
    write_text_atomic(root / "ImageAnnotation" / category / f"{stem}.json", json.dumps(ann, allow_nan=False))
    return imname


def write_spair(
    pairs: Sequence[tuple[Scene, Scene]],
    root: str | os.PathLike,
    class_specs: Sequence[ClassSpec],
    split: str = "test",
) -> Path:
    """Write synthetic image pairs in the SPair-71k layout.

    Object 0 of each scene is the pair's object; both must be of the same class, whose
    ``ClassSpec.name`` is the category. Only keypoints visible in both images are stored.
    ``Layout/large/<split>.txt`` is (over)written with the pair stems.

    Args:
        pairs: ``(source, target)`` scenes.
        root: dataset root (created if needed).
        class_specs: the world's classes, indexed by ``SceneObject.class_id``.
        split: ``"trn"``, ``"val"`` or ``"test"``.

    Returns:
        The root path.
    """
    if split not in SPLITS:
        raise DatasetFormatError(f"unknown SPair split {split!r}; choose one of {SPLITS}")
    root = Path(root)
    pair_dir = root / "PairAnnotation" / split
    pair_dir.mkdir(parents=True, exist_ok=True)
    names: dict[int, str] = {}
    stems = []
    for n, (src, trg) in enumerate(pairs, start=1):
        if not src.objects or not trg.objects:
            raise DatasetFormatError(f"pair {n}: both scenes need an object 0")
        so, to = src.objects[0], trg.objects[0]
        if so.class_id != to.class_id:
            raise DatasetFormatError(f"pair {n}: object 0 classes differ ({so.class_id} vs {to.class_id})")
        category = class_specs[so.class_id].name
        safe_join(root, category, f"class names (pair {n})")
        src_name = _write_image(src, root, category, names)
        trg_name = _write_image(trg, root, category, names)
        sk = np.asarray(so.keypoints, dtype=np.float32).reshape(-1, 3)
        tk = np.asarray(to.keypoints, dtype=np.float32).reshape(-1, 3)
        both = np.flatnonzero((sk[:, 2] > 0) & (tk[:, 2] > 0))
        stem = f"{n:06d}-{Path(src_name).stem}-{Path(trg_name).stem}:{category}"
        ann = {
            "pair_id": n,
            "filename": stem,
            "src_imname": src_name,
            "trg_imname": trg_name,
            "src_imsize": [int(src.image.shape[1]), int(src.image.shape[0]), 3],
            "trg_imsize": [int(trg.image.shape[1]), int(trg.image.shape[0]), 3],
            "src_bndbox": [_num(v) for v in np.asarray(so.box, dtype=np.float32)],
            "trg_bndbox": [_num(v) for v in np.asarray(to.box, dtype=np.float32)],
            "category": category,
            "src_pose": "Unspecified",
            "trg_pose": "Unspecified",
            "src_kps": [[_num(sk[j, 0]), _num(sk[j, 1])] for j in both],
            "trg_kps": [[_num(tk[j, 0]), _num(tk[j, 1])] for j in both],
            "kps_ids": [str(j) for j in both],
            "viewpoint_variation": 0,
            "scale_variation": 0,
            "truncation": 0,
            "occlusion": 0,
            "mirror": 0,
        }
        write_text_atomic(pair_dir / f"{stem}.json", json.dumps(ann, allow_nan=False))
        stems.append(stem)
    (root / "Layout" / "large").mkdir(parents=True, exist_ok=True)
    write_text_atomic(root / "Layout" / "large" / f"{split}.txt", "".join(f"{s}\n" for s in stems))
    return root


def _points(value: object, key: str, path: Path) -> np.ndarray:
    if isinstance(value, list) and not value:
        return np.zeros((0, 2), dtype=np.float32)
    try:
        arr = np.asarray(value, dtype=np.float32) if isinstance(value, list) else None
    except (TypeError, ValueError):
        arr = None
    if arr is None or arr.ndim != 2 or arr.shape[1] != 2 or not np.isfinite(arr).all():
        raise DatasetFormatError(f"{path}: {key!r} must be a list of [x, y] pairs")
    return arr


def _box(value: object, key: str, path: Path) -> np.ndarray:
    try:
        box = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError):
        box = None
    if box is None or box.shape != (4,) or not np.isfinite(box).all():
        raise DatasetFormatError(f"{path}: {key!r} must be [xmin, ymin, xmax, ymax]")
    return box


class SPairDataset(LazyDataset):
    """Lazy reader of one SPair-71k split: a sequence of ``ImagePair`` items.

    Construction lists the pair files only; a pair's JSON is parsed (and its image files checked for
    existence, not decoded) when the item is accessed.

    Args:
        root: dataset root.
        split: ``"trn"``, ``"val"`` or ``"test"``.
        category: keep only pairs of this category (from the file name, no JSON is opened).

    Raises:
        DatasetFormatError: unknown split or missing ``PairAnnotation/<split>`` folder.
    """

    def __init__(self, root: str | os.PathLike, split: str = "test", category: str | None = None) -> None:
        self.root = Path(root)
        self.split = split
        self.category = category
        self.name = f"spair71k-{split}" + (f"-{category}" if category else "")
        if split not in SPLITS:
            raise DatasetFormatError(f"unknown SPair split {split!r}; choose one of {SPLITS}")
        pair_dir = self.root / "PairAnnotation" / split
        if not pair_dir.is_dir():
            raise DatasetFormatError(f"SPair pair folder {pair_dir} not found (is {self.root} an SPair-71k root?)")
        files = sorted(p for p in pair_dir.iterdir() if p.suffix == ".json")
        if category is not None:
            files = [p for p in files if p.stem.rpartition(":")[2] == category]
        self._files = files

    def __len__(self) -> int:
        return len(self._files)

    def annotation_file(self, index: int) -> Path:
        """The annotation (JSON) of pair ``index``; nothing is read."""
        return self._files[index]

    def _image(self, category: str, imname: object, path: Path) -> str:
        if not isinstance(imname, str):
            raise DatasetFormatError(f"{path}: image names must be strings, got {imname!r}")
        img = safe_join(safe_join(self.root / "JPEGImages", category, str(path)), imname, str(path))
        if not img.is_file():
            raise DatasetFileNotFoundError(f"image file {img} named in {path} not found")
        return str(img)

    def _get(self, i: int) -> ImagePair:
        path = self.annotation_file(i)
        try:
            ann = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise DatasetFormatError(f"cannot parse pair annotation {path}: {err}") from err
        if not isinstance(ann, dict):
            raise DatasetFormatError(f"{path}: a pair annotation must be a JSON object")
        missing = [k for k in _PAIR_KEYS if k not in ann]
        if missing:
            raise DatasetFormatError(f"{path}: missing keys {missing}")
        category = ann["category"]
        if not isinstance(category, str):
            raise DatasetFormatError(f"{path}: 'category' must be a string")
        src_kps = _points(ann["src_kps"], "src_kps", path)
        trg_kps = _points(ann["trg_kps"], "trg_kps", path)
        if len(src_kps) != len(trg_kps):
            raise DatasetFormatError(f"{path}: {len(src_kps)} src_kps but {len(trg_kps)} trg_kps")
        return ImagePair(
            src_path=self._image(category, ann["src_imname"], path),
            trg_path=self._image(category, ann["trg_imname"], path),
            src_kps=src_kps,
            trg_kps=trg_kps,
            src_box=_box(ann["src_bndbox"], "src_bndbox", path),
            trg_box=_box(ann["trg_bndbox"], "trg_bndbox", path),
            category=category,
            meta={"annotation": str(path), **{k: ann[k] for k in _META_KEYS if k in ann}},
        )

    def __repr__(self) -> str:
        return f"SPairDataset(root={str(self.root)!r}, split={self.split!r}, pairs={len(self)})"
