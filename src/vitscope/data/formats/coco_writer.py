"""COCO instance segmentation files written from synthetic scenes (the layout and conventions are
:mod:`vitscope.data.formats.coco`'s): polygons, or RLE that round-trips masks exactly."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pycocotools import mask as mask_utils
from skimage.measure import approximate_polygon, find_contours

from vitscope.atomic import write_text_atomic
from vitscope.data.formats.common import PathLike, image_suffix, mask_to_box, save_image
from vitscope.data.synthetic.scene import Scene
from vitscope.errors import VitscopeValueError

__all__ = ["coco_annotation", "mask_to_polygons", "mask_to_rle", "write_coco", "write_coco_files"]


def mask_to_polygons(mask: np.ndarray) -> list[list[float]]:
    """Outer and inner outlines of a ``[H, W]`` mask as COCO polygons ``[x0, y0, x1, y1, ...]``.

    Contours are traced at level 0.5 through the pixel edges (pixel ``(r, c)`` covers
    ``[c, c+1) x [r, r+1)``); collinear points are dropped; outlines of fewer than 3 points are skipped.
    """
    padded = np.pad(np.asarray(mask).astype(np.float32), 1)
    polygons = []
    for contour in find_contours(padded, 0.5):
        contour = approximate_polygon(contour, tolerance=0)
        if len(contour) >= 4:  # closed outline: first point repeated, so >= 3 distinct points
            xy = contour[:, ::-1] - 0.5  # padded centre coordinates -> pixel-edge coordinates
            polygons.append([round(float(v), 2) for v in xy.ravel()])
    return polygons


def mask_to_rle(mask: np.ndarray) -> dict:
    """Compressed COCO RLE of a ``[H, W]`` mask, JSON-ready (``counts`` as str)."""
    rle = mask_utils.encode(np.asfortranarray(np.asarray(mask).astype(np.uint8)))
    return {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}


def coco_annotation(mask: np.ndarray, ann_id: int, image_id: int, category_id: int, use_rle: bool) -> dict | None:
    """One COCO annotation for a non-empty mask (None when the mask is empty or yields no polygon).

    ``area`` is the pixel count of ``mask``; ``bbox`` its exact box ``[x, y, w, h]``; ``iscrowd`` 0.
    """
    mask = np.asarray(mask).astype(bool)
    if not mask.any():
        return None
    segmentation: Any = mask_to_rle(mask) if use_rle else mask_to_polygons(mask)
    if not segmentation:
        return None
    x1, y1, x2, y2 = (float(v) for v in mask_to_box(mask))
    return {
        "id": ann_id,
        "image_id": image_id,
        "category_id": category_id,
        "segmentation": segmentation,
        "area": float(mask.sum()),
        "bbox": [x1, y1, x2 - x1, y2 - y1],
        "iscrowd": 0,
    }


def write_coco_files(
    scenes: Iterable[Scene],
    image_dir: Path,
    ann_path: Path,
    categories: list[dict],
    instances: Callable[[Scene], Iterator[tuple[np.ndarray, int]]],
    use_rle: bool,
    file_name: Callable[[Scene], str],
    image_fields: Callable[[Scene], dict] | None = None,
) -> Path:
    """Write images and one annotation file; ``instances(scene)`` yields ``(mask, category_id)`` pairs.

    Image ids are ``scene.index + 1`` (COCO ids are positive); annotation ids count from 1. ``image_fields(scene)``
    adds keys to an image's entry (readers of COCO ignore keys they do not know).
    """
    images, annotations = [], []
    for scene in scenes:
        image_id = int(scene.index) + 1
        name = file_name(scene)
        save_image(scene.image, image_dir / name)
        height, width = scene.image.shape[:2]
        images.append({"id": image_id, "file_name": name, "width": int(width), "height": int(height),
                       **(image_fields(scene) if image_fields is not None else {})})
        for mask, category_id in instances(scene):
            ann = coco_annotation(mask, len(annotations) + 1, image_id, category_id, use_rle)
            if ann is not None:
                annotations.append(ann)
    ann_path.parent.mkdir(parents=True, exist_ok=True)
    data = {"images": images, "annotations": annotations, "categories": categories}
    write_text_atomic(ann_path, json.dumps(data, allow_nan=False))
    return ann_path


def write_coco(
    scenes: Iterable[Scene],
    root: PathLike,
    categories: Sequence[str] | Sequence[dict],
    split: str = "val2017",
    use_rle: bool = False,
    image_format: str = "jpg",
) -> Path:
    """Write scenes as a COCO instance dataset (module docstring): one annotation per visible object.

    Args:
        scenes: scenes to write; ``SceneObject.class_id`` indexes ``categories``.
        root: output folder.
        categories: class names (COCO ids 1..C, supercategory ``"object"``) or COCO category dicts
            (``id``, ``name``, optional ``supercategory``) in class-id order.
        split: split name (image folder and ``instances_<split>.json``).
        use_rle: write compressed RLE (exact) instead of polygons (lossy at borders, no holes).
        image_format: ``"jpg"`` (default, as COCO) or ``"png"``.

    Returns:
        Path of the annotation file.
    """
    cats = [
        {"id": i + 1, "name": c, "supercategory": "object"}
        if isinstance(c, str)
        else {"id": int(c["id"]), "name": str(c["name"]), "supercategory": str(c.get("supercategory", "object"))}
        for i, c in enumerate(categories)
    ]
    if len({c["id"] for c in cats}) != len(cats):
        raise VitscopeValueError("category ids must be distinct")
    suffix = image_suffix(image_format)
    root = Path(root)

    def instances(scene: Scene) -> Iterator[tuple[np.ndarray, int]]:
        for obj in scene.objects:
            yield obj.mask, cats[obj.class_id]["id"]

    return write_coco_files(
        scenes,
        root / split,
        root / "annotations" / f"instances_{split}.json",
        cats,
        instances,
        use_rle,
        lambda s: f"{int(s.index) + 1:012d}{suffix}",
        lambda s: {"background": int(s.background)},  # the scene's background type: the shortcut's ground truth
    )
