"""Any annotated dataset format (COCO, ImageFolder, SOP, ...) as a :class:`~vitscope.data.source.Source`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from vitscope.data.formats.errors import DatasetFormatError
from vitscope.data.images import ImageLoadError, load_rgb, oriented_size
from vitscope.data.source import Source

__all__ = ["AnnotatedSource", "region_masks"]


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


def _listed_paths(dataset: Any) -> Sequence[str]:
    """Every image path of a reader, without building items where the reader lists them (building a COCO
    item decodes its masks); other readers answer lazily."""
    if hasattr(dataset, "samples"):  # ImageFolderDataset: (path, label) pairs
        return [str(p) for p, _ in dataset.samples]
    listed = getattr(dataset, "image_paths", None)  # PathListDataset: its rows resolved from the list's folder
    if isinstance(listed, list) and len(listed) == len(dataset):
        return listed
    if isinstance(getattr(dataset, "_paths", None), list) and len(dataset._paths) == len(dataset):  # COCO family
        return [str(p) for p in dataset._paths]
    return _LazyPaths(dataset)


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
        self.paths = _listed_paths(dataset)

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
        if callable(own):  # a reader that keeps part of a dataset lists what it reads (FirstItems)
            return own()
        root = getattr(self.dataset, "root", None)
        if root is not None and Path(root).is_dir():  # every file under the root, annotations included
            return sorted(str(p) for p in Path(root).rglob("*") if p.is_file()), Path(root)
        files = [str(p) for p in self.paths] + [str(f) for f in (getattr(self.dataset, a, None) for a in
                                                                 ("ann_file", "gnd_file")) if f is not None]
        return files, Path(root) if root is not None else Path(".")

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "source": str(getattr(self.dataset, "root", "")), "num_files": len(self),
                "format": type(self.dataset).__name__}
