"""COCO instance segmentation: a lazy reader built on pycocotools (the writer is :mod:`.coco_writer`).

Layout (official)::

    root/<split>/<file_name>                       e.g. root/val2017/000000000001.jpg
    root/annotations/instances_<split>.json        {"images", "annotations", "categories"}

Segmentations are polygon lists (``iscrowd`` 0 in real COCO) or RLE dicts with ``counts`` either a
compressed string or an uncompressed list of run lengths (column-major, starting with background, as
``iscrowd`` 1 in real COCO). Polygons are filled outlines: writing a mask as polygons loses its holes and
can move boundary pixels, so only the RLE path (``use_rle=True``) round-trips masks exactly.

Reader conventions: ``instance_labels`` index the categories sorted by COCO id (``category_ids`` maps
back); boxes go from COCO ``[x, y, w, h]`` to ``[x1, y1, x2, y2]`` (same 0-based pixel-edge frame, x2/y2
exclusive); ``label`` = category index of the largest annotation by its ``area`` field (non-crowd
annotations first; None when the image has none). The annotation file is parsed and its file names are
checked (lexically) at construction; images are checked for existence only when their item is accessed.
"""

from __future__ import annotations

import contextlib
import io
import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from pycocotools.coco import COCO

from vitscope.data.formats.common import (
    DatasetFormatError,
    LazyDataset,
    PathLike,
    mask_to_box,
    read_json,
    require_file,
    safe_join,
)
from vitscope.data.items import AnnotatedImage


def _check_int(value: Any, where: str, positive: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or (positive and value <= 0):
        raise DatasetFormatError(f"{where} must be {'a positive' if positive else 'an'} integer, got {value!r}")
    return value


def _rle_string_total(counts: str, where: str) -> int:
    """Sum of the run lengths of a compressed RLE string (as pycocotools' rleFrString decodes it)."""
    runs: list[int] = []
    p = 0
    while p < len(counts):
        x, k, more = 0, 0, True
        while more:
            if p >= len(counts):
                raise DatasetFormatError(f"{where}: truncated RLE counts string")
            c = ord(counts[p]) - 48
            if not 0 <= c < 64:
                raise DatasetFormatError(f"{where}: invalid character {counts[p]!r} in RLE counts")
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            p += 1
            k += 1
            if not more and c & 0x10:
                x |= -1 << (5 * k)
        if len(runs) > 2:
            x += runs[-2]
        if x < 0:
            raise DatasetFormatError(f"{where}: negative run length in RLE counts")
        runs.append(x)
    return sum(runs)


def _refuse_duplicates(ids: list[Any], what: str) -> None:
    seen: set[Any] = set()
    repeated = sorted({str(i) for i in ids if i in seen or seen.add(i)})  # type: ignore[func-returns-value]
    if repeated:
        raise DatasetFormatError(f"{what}s must be distinct; repeated: {', '.join(repeated[:5])}"
                                 f"{f' and {len(repeated) - 5} more' if len(repeated) > 5 else ''}")


def _checked_box(bbox: Any, size: tuple[int, int], where: str) -> list[float]:
    """A COCO ``[x, y, width, height]`` box clipped to its image (boxes a pixel or two over the border are
    common in real annotations); a malformed box or one wholly outside the image is refused."""
    if (not isinstance(bbox, (list, tuple)) or len(bbox) != 4
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in bbox)):
        raise DatasetFormatError(f"{where}: bbox must be four finite numbers [x, y, width, height], got {bbox!r}")
    x, y, bw, bh = (float(v) for v in bbox)
    if bw < 0 or bh < 0:
        raise DatasetFormatError(f"{where}: bbox {bbox!r} has a negative width or height")
    width, height = size
    x1, y1, x2, y2 = max(x, 0.0), max(y, 0.0), min(x + bw, float(width)), min(y + bh, float(height))
    if x2 < x1 or y2 < y1:
        raise DatasetFormatError(f"{where}: bbox {bbox!r} lies outside its {width}x{height} image")
    return [x1, y1, x2 - x1, y2 - y1]


def check_segmentation(seg: Any, height: int, width: int, where: str) -> None:
    """Validate a COCO segmentation before pycocotools decodes it (its C decoder does not bounds-check)."""
    if isinstance(seg, list):
        for poly in seg:
            if not isinstance(poly, list) or len(poly) % 2:
                raise DatasetFormatError(f"{where}: each polygon must be a list of numbers (x, y pairs)")
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in poly):
                raise DatasetFormatError(f"{where}: polygon coordinates must be numbers")
        return
    if not isinstance(seg, dict) or "counts" not in seg or "size" not in seg:
        raise DatasetFormatError(f"{where}: segmentation must be a polygon list or an RLE dict with size and counts")
    if list(seg["size"]) != [height, width]:
        raise DatasetFormatError(f"{where}: RLE size {seg['size']} differs from the image size [{height}, {width}]")
    counts = seg["counts"]
    if isinstance(counts, list):
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts):
            raise DatasetFormatError(f"{where}: uncompressed RLE counts must be non-negative integers")
        total = sum(counts)
    elif isinstance(counts, str):
        total = _rle_string_total(counts, where)
    else:
        raise DatasetFormatError(f"{where}: RLE counts must be a list of integers or a string")
    if total != height * width:
        raise DatasetFormatError(f"{where}: RLE run lengths sum to {total}, expected height*width = {height * width}")


def _area(ann: dict, mask: Callable[[], np.ndarray]) -> float:
    """An annotation's area: its ``area`` field, else the pixel count of its mask (``mask()``, called only then)."""
    area = ann.get("area")
    return float(area) if isinstance(area, (int, float)) else float(mask().sum())


class CocoDataset(LazyDataset):
    """Lazy reader of a COCO instance dataset (conventions in the module docstring).

    Items: ``masks`` ``[n, H, W]`` bool, ``instance_labels`` ``[n]``, ``boxes`` ``[n, 4]`` float32,
    ``label``, ``meta`` = ``{"image_id", "category_ids", "annotation_ids", "iscrowd"}`` and, for the synthetic
    world, ``"background"`` (the scene's background type, ``synth.json``'s ``backgrounds`` names them).

    Attributes:
        coco: the ``pycocotools.coco.COCO`` index.
        categories: category dicts sorted by id; ``classes`` their names; ``category_ids`` their ids.
    """

    def __init__(
        self,
        root: PathLike,
        split: str = "val2017",
        ann_file: PathLike | None = None,
        image_dir: PathLike | None = None,
    ) -> None:
        """Parse and validate the annotation file (no image is opened).

        Args:
            root: dataset folder.
            split: split name; default files ``root/annotations/instances_<split>.json`` and ``root/<split>/``.
            ann_file: annotation file, overriding the default.
            image_dir: folder the ``file_name`` entries are relative to, overriding ``root/<split>``.

        Raises:
            DatasetFileNotFoundError: the annotation file is missing.
            DatasetFormatError: malformed JSON or schema, unsafe file name, unknown image or category id.
        """
        super().__init__(root, name=f"coco:{split}")
        self.ann_file = (
            Path(ann_file) if ann_file is not None else self.root / "annotations" / f"instances_{split}.json"
        )
        self.image_dir = Path(image_dir) if image_dir is not None else self.root / split
        data = read_json(self.ann_file)
        src = self.ann_file.name
        if not isinstance(data, dict) or not isinstance(data.get("images"), list):
            raise DatasetFormatError(f"{self.ann_file} is not a COCO annotation file: no 'images' list")
        data.setdefault("annotations", [])
        data.setdefault("categories", [])
        for key in ("annotations", "categories"):
            if not isinstance(data[key], list) or not all(isinstance(e, dict) for e in data[key]):
                raise DatasetFormatError(f"{self.ann_file}: '{key}' must be a list of objects")
        self.categories = sorted(data["categories"], key=lambda c: _check_int(c.get("id"), f"{src}: category id"))
        self.category_ids = [c["id"] for c in self.categories]
        self.classes = [str(c.get("name", c["id"])) for c in self.categories]
        if len(set(self.category_ids)) != len(self.category_ids):
            raise DatasetFormatError(f"{self.ann_file}: duplicate category ids")
        self._cat_index = {cid: i for i, cid in enumerate(self.category_ids)}
        self._paths: list[Path] = []
        for k, img in enumerate(data["images"]):
            where = f"image entry {k} (id {img.get('id') if isinstance(img, dict) else '?'}) of {src}"
            if not isinstance(img, dict):
                raise DatasetFormatError(f"{where} is not an object")
            _check_int(img.get("id"), f"{where}: id")
            _check_int(img.get("height"), f"{where}: height", positive=True)
            _check_int(img.get("width"), f"{where}: width", positive=True)
            self._paths.append(safe_join(self.image_dir, img.get("file_name"), where))
        self._image_ids = [img["id"] for img in data["images"]]
        _refuse_duplicates(self._image_ids, f"{self.ann_file}: image id")
        sizes = {img["id"]: (img["width"], img["height"]) for img in data["images"]}
        for k, ann in enumerate(data["annotations"]):
            where = f"annotation entry {k} (id {ann.get('id')}) of {src}"
            for key in ("id", "image_id", "category_id"):
                _check_int(ann.get(key), f"{where}: {key}")
            if ann.get("image_id") not in sizes:
                raise DatasetFormatError(f"{where}: unknown image_id {ann.get('image_id')!r}")
            if ann.get("category_id") not in self._cat_index:
                raise DatasetFormatError(f"{where}: unknown category_id {ann.get('category_id')!r}")
            if "segmentation" not in ann:
                raise DatasetFormatError(f"{where}: no segmentation")
            if ann.get("bbox") is not None:
                ann["bbox"] = _checked_box(ann["bbox"], sizes[ann["image_id"]], where)
        _refuse_duplicates([a["id"] for a in data["annotations"]], f"{self.ann_file}: annotation id")
        self.coco = COCO()
        self.coco.dataset = data
        with contextlib.redirect_stdout(io.StringIO()):
            self.coco.createIndex()

    def __len__(self) -> int:
        return len(self._paths)

    @property
    def labels(self) -> np.ndarray:
        """``[N]`` int64 ``label`` of every image (-1: no annotation), from the annotation file: a mask is decoded
        only for an annotation without an ``area`` field."""
        out = np.full(len(self), -1, dtype=np.int64)
        for i in range(len(self)):
            img, anns = self._annotations(i)
            try:
                label = self._image_label(anns, [_area(a, lambda a=a, img=img: self._mask(a, img)) for a in anns])
            except DatasetFormatError:  # a malformed mask: the image is skipped when read, so it has no label
                continue
            out[i] = -1 if label is None else label
        return out

    def _mask(self, ann: dict, img: dict) -> np.ndarray:
        """``[H, W]`` bool mask of one annotation (an empty segmentation is an empty mask)."""
        check_segmentation(ann["segmentation"], img["height"], img["width"],
                           f"{self.ann_file.name} annotation id {ann.get('id')}")
        seg = ann["segmentation"]
        if isinstance(seg, list):  # polygons of under three points cover nothing (released PartImageNet has some)
            seg = [poly for poly in seg if len(poly) >= 6]
        if not seg:
            return np.zeros((img["height"], img["width"]), dtype=bool)
        with warnings.catch_warnings():  # pycocotools vs numpy 2 copy-keyword deprecation
            warnings.filterwarnings("ignore", message=".*__array__ implementation", category=DeprecationWarning)
            return self.coco.annToMask({**ann, "segmentation": seg}).astype(bool)

    def _image_label(self, anns: list[dict], areas: list[float]) -> int | None:
        """The image's ``label``: category index of its largest annotation, non-crowd ones first (None without)."""
        if not anns:
            return None
        crowd = [bool(a.get("iscrowd", 0)) for a in anns]
        return self._cat_index[anns[max(range(len(anns)), key=lambda j: (not crowd[j], areas[j], -j))]["category_id"]]

    def _annotations(self, index: int) -> tuple[dict, list[dict]]:
        img = self.coco.imgs[self._image_ids[index]]
        return img, self.coco.imgToAnns.get(img["id"], [])

    def _get(self, index: int) -> AnnotatedImage:
        img, anns = self._annotations(index)
        path = require_file(self._paths[index], f"{self.name} image id {img['id']} ({img['file_name']})")
        h, w = img["height"], img["width"]
        masks = np.zeros((len(anns), h, w), dtype=bool)
        boxes = np.zeros((len(anns), 4), dtype=np.float32)
        for j, ann in enumerate(anns):
            masks[j] = self._mask(ann, img)
            bbox = ann.get("bbox")
            if isinstance(bbox, list) and len(bbox) == 4:
                x, y, bw, bh = (float(v) for v in bbox)
                boxes[j] = [x, y, x + bw, y + bh]
            else:
                boxes[j] = mask_to_box(masks[j])
        labels = np.array([self._cat_index[a["category_id"]] for a in anns], dtype=np.int64)
        crowd = np.array([int(bool(a.get("iscrowd", 0))) for a in anns], dtype=np.int64)
        label = self._image_label(anns, [_area(a, lambda m=m: m) for a, m in zip(anns, masks)])
        meta = {
            "image_id": img["id"],
            "category_ids": [a["category_id"] for a in anns],
            "annotation_ids": [a.get("id") for a in anns],
            "iscrowd": crowd,
        }
        if isinstance(img.get("background"), int):  # vitscope's synthetic world: the scene's background type
            meta["background"] = img["background"]
        return AnnotatedImage(
            image_path=str(path), label=label, masks=masks, instance_labels=labels, boxes=boxes, meta=meta
        )
