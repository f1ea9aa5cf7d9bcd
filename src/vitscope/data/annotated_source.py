"""Any annotated dataset format (COCO, ImageFolder, SOP, ...) as a :class:`~vitscope.data.source.Source`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from vitscope.data.formats.errors import DatasetFormatError
from vitscope.data.images import ImageLoadError, load_rgb, oriented_size
from vitscope.data.load import SPLIT_ARGUMENT, format_of
from vitscope.data.source import Source

__all__ = ["LABEL_RULES", "AnnotatedSource", "reader_description", "reader_files", "region_masks"]

#: how each format's reader gives an image its label (results.json ``data.label_rule``): the numbers a probe or
#: a class score reads depend on it
LABEL_RULES = {
    "imagefolder": "the image's class folder; labels number the sub-folder names in sorted order",
    "imagenet-boxes": "the image's synset (its class folder, or its row of LOC_<split>_solution.csv), numbered in "
                      "the order of LOC_synset_mapping.txt",
    "coco": "the category of the image's largest annotation by its area field, non-crowd annotations first "
            "(categories numbered in COCO id order); an image without annotations is unlabelled",
    "partimagenet": "the object class (supercategory) whose non-crowd parts cover the most area in the image "
                    "(classes numbered in order of first appearance over the part ids)",
    "list": "the label field of the image's line: integers as written, names numbered in sorted order",
    "sop": "the product of the image's row (class_id - 1)",
}
#: the label rule of formats whose items carry no image label (DAVIS, SPair, RevisitOP)
NO_LABELS = "none: the format gives no image labels"


class _LazyPaths(Sequence):
    """``paths[i]`` reads one entry's path on demand: million-entry datasets stay lazy."""

    def __init__(self, dataset: Any) -> None:
        self._ds = dataset

    def __len__(self) -> int:
        return len(self._ds)

    def __getitem__(self, i):  # type: ignore[override]
        try:
            return self._ds[i].image_path
        except DatasetFormatError as err:
            return f"<entry {i}: {err}>"


#: a reader's per-item lists of image paths, in the order they are looked for (ImageFolder and ImageNet: ``(path,
#: label)`` pairs; a path list: its rows resolved from the list's folder; the COCO family: paths)
_LISTED = ("samples", "image_paths", "_paths")
#: a reader's attributes naming the files that define its items beside the images (annotations, lists, splits)
_DEFINING_FILES = ("ann_file", "gnd_file", "list_file", "set_file", "mapping_file", "solution_file")


def _listed_paths(dataset: Any) -> list[str] | None:
    """Every image path of a reader in item order where the reader lists them, or None: no item is built (building
    a COCO item decodes its masks)."""
    for attr in _LISTED:
        listed = getattr(dataset, attr, None)
        if isinstance(listed, (list, tuple)) and len(listed) == len(dataset):
            return [str(p[0] if isinstance(p, tuple) else p) for p in listed]
    return None


def _item_files(item: Any) -> list[str]:
    """The files one item reads: an image, a sequence's frames and masks, a pair's two images."""
    files = [getattr(item, a, None) for a in ("image_path", "src_path", "trg_path")]
    files += list(getattr(item, "frame_paths", None) or ()) + list(getattr(item, "mask_paths", None) or ())
    return [str(f) for f in files if f is not None]


def reader_files(dataset: Any) -> tuple[list[str], Path]:
    """The files a format reader reads, for the data fingerprint: item by item in its order, then the files that
    define its items (an annotation, list or split file). Only what the reader selected is listed, so two splits or
    two lists under one root are two datasets.

    Listed image paths are taken as listed; other readers' items are built (a DAVIS sequence's frames and masks, an
    SPair pair's images). A reader's ``annotation_file(i)`` (an image's box file, a pair's annotation) follows item
    ``i``'s files. Nothing is read but what building an item reads.

    Args:
        dataset: a format reader (``len``, ``dataset[i]``), or :class:`~vitscope.data.first_items.FirstItems`.

    Returns:
        ``(files, root)``: the paths, and the root they are signed relative to.
    """
    root = Path(getattr(dataset, "root", None) or ".")
    listed = _listed_paths(dataset)
    annotation = getattr(dataset, "annotation_file", None)
    files: list[str] = []
    for i in range(len(dataset)):
        if listed is not None:
            files.append(listed[i])
        else:
            try:
                files += _item_files(dataset[i])
            except DatasetFormatError:  # a file it names is missing: a missing entry at its position
                files.append(str(root / f"<entry {i}: unreadable>"))
        if callable(annotation):
            files.append(str(annotation(i)))
    files += [str(f) for f in (getattr(dataset, a, None) for a in _DEFINING_FILES) if f is not None]
    return files, root


def _reader_of(dataset: Any) -> Any:
    """The format reader under wrappers that keep a part of it (``FirstItems``: the first items, ``--limit``)."""
    for _ in range(4):
        if format_of(dataset) is not None or not hasattr(dataset, "dataset"):
            break
        dataset = dataset.dataset
    return dataset


def _split_of(reader: Any, fmt: str | None) -> str | None:
    """The split a reader reads, for formats whose releases ship several (the default one included)."""
    if fmt not in SPLIT_ARGUMENT:
        return None
    if SPLIT_ARGUMENT[fmt] == "name":  # RevisitOP: the dataset's name picks its ground truth
        return str(reader.name)
    split = getattr(reader, "split", None)  # COCO and its kin name it in their name ("coco:val2017")
    return str(split) if split is not None else (str(reader.name).partition(":")[2] or None)


def reader_description(dataset: Any) -> dict[str, Any]:
    """What results.json says of a format reader beside its name and size: ``format`` (its id, as ``--data
    ROOT::FORMAT`` names it), ``split`` (formats with splits), ``label_rule`` and ``classes`` (names by label,
    where the reader names them).

    Args:
        dataset: a format reader, or a part of one (``FirstItems``).
    """
    reader = _reader_of(dataset)
    fmt = format_of(reader)
    out: dict[str, Any] = {"format": fmt or "reader"}
    if fmt is None:  # a reader of the user's own: its class is what names it
        out["reader"] = type(reader).__name__
    split = _split_of(reader, fmt)
    if split:
        out["split"] = split
    out["label_rule"] = LABEL_RULES.get(fmt or "", NO_LABELS if fmt else "the reader's own label of each item")
    classes = getattr(reader, "classes", None) or getattr(reader, "class_names", None)
    if classes:
        out["classes"] = [str(c) for c in classes]
    return out


def region_masks(item: Any, skip_crowd: bool = True) -> tuple[np.ndarray, np.ndarray] | None:
    """``([M, H, W] bool, [M] int64)`` masks and labels of an AnnotatedImage (crowd ones left out), or None."""
    if getattr(item, "masks", None) is None or getattr(item, "instance_labels", None) is None:
        return None
    keep = np.ones(len(item.instance_labels), dtype=bool)
    crowd = item.meta.get("iscrowd") if isinstance(item.meta, dict) else None
    if skip_crowd and crowd is not None:
        keep &= np.asarray(crowd) == 0
    return np.asarray(item.masks)[keep].astype(bool), np.asarray(item.instance_labels)[keep].astype(np.int64)


class AnnotatedSource(Source):
    """Images of a format reader's AnnotatedImage items with their ground truth.

    ``targets(i)``: ``label``, ``instance_ids`` and ``masks`` (``[n, H, W]`` bool at the image's size) where the
    item has them. With ``regions=True`` (object- and part-level features), ``masks`` are the region masks with
    crowd annotations left out and ``instance_labels`` their labels. A missing file (the reader's
    DatasetFormatError) or an undecodable one is an :class:`ImageLoadError`, skipped or fatal as the reader says.

    Args:
        dataset: the reader (``len``, ``dataset[i]``; :func:`vitscope.data.load_dataset`).
        strict: :meth:`get` raises on unreadable entries.
        regions: targets carry crowd-free region masks and their labels.
    """

    def __init__(self, dataset: Any, strict: bool = False, regions: bool = False) -> None:
        super().__init__(strict=strict)
        self.dataset = dataset
        self.regions_in_targets = bool(regions)
        self.name = getattr(dataset, "name", type(dataset).__name__)
        listed = _listed_paths(dataset)
        self.paths: Sequence[str] = _LazyPaths(dataset) if listed is None else listed

    def load(self, i: int) -> Image.Image:
        try:
            item = self.dataset[i]
        except DatasetFormatError as err:
            raise ImageLoadError(f"entry {i}", str(err)) from None
        return load_rgb(item.image_path)

    def targets(self, i: int) -> dict[str, Any]:
        item = self.dataset[i]
        out: dict[str, Any] = {}
        if getattr(item, "label", None) is not None:
            out["label"] = item.label
        if getattr(item, "instance_ids", None) is not None:
            out["instance_ids"] = item.instance_ids
        if getattr(item, "masks", None) is not None:  # [n, H, W] bool at the image's size (saliency_iou)
            out["masks"] = item.masks
        elif getattr(item, "boxes", None) is not None:  # boxes alone (ImageNet's): with the size they are in
            out["boxes"] = (np.asarray(item.boxes, dtype=np.float32).reshape(-1, 4), oriented_size(item.image_path))
        if self.regions_in_targets:
            regions = region_masks(item)
            if regions is not None:
                out["masks"], out["instance_labels"] = regions
        return out

    def labels(self) -> np.ndarray:
        listed = getattr(self.dataset, "labels", None)  # readers that list their labels open no file for them
        if listed is not None and not callable(listed) and len(listed) == len(self):
            out = np.array(listed, dtype=np.int64)
        else:
            out = np.full(len(self), -1, dtype=np.int64)
            for i in range(len(self)):
                try:
                    label = getattr(self.dataset[i], "label", None)
                except DatasetFormatError:  # a missing file: skipped when read, so no label
                    continue
                if label is not None:
                    out[i] = int(label)
        if not len(out) or (out < 0).all():
            raise self._no_labels()
        return out

    def regions(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        found = region_masks(self.dataset[i])
        return super().regions(i) if found is None else found

    def fingerprint_files(self) -> tuple[Sequence[str], Path] | None:
        own = getattr(self.dataset, "fingerprint_files", None)
        if callable(own):  # a reader that knows its files better
            return own()
        return reader_files(self.dataset)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "source": str(getattr(self.dataset, "root", "")), "num_files": len(self),
                **reader_description(self.dataset)}
