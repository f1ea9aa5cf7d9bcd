"""Image sources for feature extraction: ordered images, their labels, and their region masks.

A source is indexable by position ``0 .. len-1``; the position is the ``index`` column of every cache
entry built from it. ``fingerprint`` keys the cache: image files by (path, size, modification time), plus
the annotation files when rows depend on them (mask pooling).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

from vitscope.data.annotated_source import AnnotatedSource
from vitscope.data.images import load_rgb
from vitscope.features.fingerprint import digest, files_fingerprint

__all__ = ["DatasetSource", "ImageSource", "MaskedAnnotatedSource", "PathSource", "as_source"]


class ImageSource:
    """Ordered image files; subclasses add labels and masks."""

    def __init__(self, paths: Sequence[str | os.PathLike], name: str = "images") -> None:
        self.paths = [os.fspath(p) for p in paths]
        self.name = name

    def __len__(self) -> int:
        return len(self.paths)

    def image(self, i: int) -> Image.Image:
        """Decode image ``i`` to RGB (raises ``ImageLoadError`` naming the file)."""
        return load_rgb(self.paths[i])

    def annotation_files(self) -> list[str]:
        """Files the labels and masks come from (part of the fingerprint of mask-pooled rows)."""
        return []

    def fingerprint(self, with_annotations: bool = False) -> str:
        """Digest of the image files (and of the annotation files when asked)."""
        parts = {"images": files_fingerprint(self.paths), "n": len(self.paths)}
        if with_annotations:
            parts["annotations"] = files_fingerprint(self.annotation_files())
        return digest(parts)

    def labels(self) -> np.ndarray:
        """``[n]`` int64 image labels (-1 where unknown)."""
        raise ValueError(f"{self.name}: this source has no image labels; open an annotated dataset "
                         "(imagefolder, coco, partimagenet...) with DatasetSource")

    def masks(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """``([M, H, W] bool, [M] int64)`` region masks of image ``i`` and their labels."""
        raise ValueError(f"{self.name}: this source has no region masks; object- and part-level features need "
                         "a dataset with instance masks (coco, partimagenet) opened with DatasetSource")


class PathSource(ImageSource):
    """Plain list of image paths, with optional labels."""

    def __init__(self, paths: Sequence[str | os.PathLike], labels: Sequence[int] | None = None,
                 name: str = "images") -> None:
        super().__init__(paths, name)
        if labels is not None and len(labels) != len(self.paths):
            raise ValueError(f"{len(labels)} labels for {len(self.paths)} paths")
        self._labels = None if labels is None else np.asarray(labels, dtype=np.int64)

    def labels(self) -> np.ndarray:
        if self._labels is None:
            return super().labels()
        return self._labels.copy()


def _image_paths(dataset: Any) -> list[str]:
    """Every image path of a reader, without building items where the reader lists them (building a COCO
    item decodes its masks)."""
    if hasattr(dataset, "samples"):  # ImageFolderDataset: (path, label) pairs
        return [str(p) for p, _ in dataset.samples]
    if isinstance(getattr(dataset, "_paths", None), list) and len(dataset._paths) == len(dataset):  # COCO family
        return [str(p) for p in dataset._paths]
    return [dataset[i].image_path for i in range(len(dataset))]


def region_masks(item: Any, skip_crowd: bool = True) -> tuple[np.ndarray, np.ndarray] | None:
    """``([M, H, W] bool, [M] int64)`` masks and labels of an AnnotatedImage (crowd ones left out), or None."""
    if getattr(item, "masks", None) is None or getattr(item, "instance_labels", None) is None:
        return None
    keep = np.ones(len(item.instance_labels), dtype=bool)
    crowd = item.meta.get("iscrowd") if isinstance(item.meta, dict) else None
    if skip_crowd and crowd is not None:
        keep &= np.asarray(crowd) == 0
    return np.asarray(item.masks)[keep].astype(bool), np.asarray(item.instance_labels)[keep].astype(np.int64)


class DatasetSource(ImageSource):
    """Images of a format reader whose items are ``AnnotatedImage`` (imagefolder, coco, partimagenet, ...).

    Args:
        dataset: the reader (``len``, ``dataset[i]``).
        skip_crowd: leave out crowd annotations (``meta["iscrowd"]``) from the masks.
    """

    def __init__(self, dataset: Any, skip_crowd: bool = True) -> None:
        self.dataset = dataset
        self.skip_crowd = skip_crowd
        super().__init__(_image_paths(dataset), getattr(dataset, "name", "dataset"))

    def annotation_files(self) -> list[str]:
        files = [getattr(self.dataset, a, None) for a in ("ann_file", "gnd_file")]
        return [os.fspath(f) for f in files if f is not None]

    def labels(self) -> np.ndarray:
        out = np.full(len(self), -1, dtype=np.int64)
        for i in range(len(self)):
            label = getattr(self.dataset[i], "label", None)
            if label is not None:
                out[i] = int(label)
        if (out < 0).all():
            return super().labels()
        return out

    def masks(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        regions = region_masks(self.dataset[i], self.skip_crowd)
        return super().masks(i) if regions is None else regions


def as_source(data: Any) -> ImageSource:
    """An ImageSource from a source, a format reader, or a list of paths."""
    if isinstance(data, ImageSource):
        return data
    if isinstance(data, (list, tuple)):
        return PathSource(data)
    if hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        return DatasetSource(data)
    raise TypeError(f"cannot read images from {type(data).__name__}; pass an ImageSource, a dataset or paths")


class MaskedAnnotatedSource(AnnotatedSource):
    """Engine dataset of an annotated reader whose targets also carry the region masks.

    ``targets`` per image: ``label`` (if any), ``masks`` ``[M, H, W]`` bool and ``instance_labels`` ``[M]``
    (crowd regions left out), as the object- and part-level clustering expects.
    """

    def _targets(self, i: int) -> dict:
        out = super()._targets(i)
        regions = region_masks(self.dataset[i])
        if regions is not None:
            out["masks"], out["instance_labels"] = regions
        return out
