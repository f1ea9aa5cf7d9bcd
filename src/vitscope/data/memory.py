"""``InMemoryImages``: images you already hold (PIL images or ``H x W x 3`` uint8 arrays) as a source."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

from vitscope.data.images import as_rgb8
from vitscope.data.source import Source
from vitscope.errors import VitscopeTypeError, VitscopeValueError

__all__ = ["InMemoryImages"]


class InMemoryImages(Source):
    """A list of PIL images or ``H x W x 3`` uint8 arrays; resumable runs fingerprint their pixels.

    Args:
        images: the images.
        labels: optional class label per image (``targets["label"]``).
        names: what to call each image in outputs (default ``image:0``, ``image:1``...).
        name: what to call the data.
    """

    def __init__(self, images: Sequence[Any], labels: Sequence[int] | None = None,
                 names: Sequence[str] | None = None, name: str = "images") -> None:
        super().__init__()
        self.images = [_as_rgb(im, i) for i, im in enumerate(images)]
        if not self.images:
            raise VitscopeValueError("no images given")
        if labels is not None and len(labels) != len(self.images):
            raise VitscopeValueError(f"{len(labels)} labels for {len(self.images)} images")
        if names is not None and len(names) != len(self.images):
            raise VitscopeValueError(f"{len(names)} names for {len(self.images)} images")
        self._labels = None if labels is None else [int(v) for v in labels]
        self.paths = list(names) if names is not None else [f"image:{i}" for i in range(len(self.images))]
        self.name = name

    def load(self, i: int) -> Image.Image:
        return self.images[i]

    def targets(self, i: int) -> dict[str, Any]:
        return {} if self._labels is None else {"label": self._labels[i]}

    def memory_digest(self) -> str | None:
        return None if self._labels is None else hashlib.sha256(repr(self._labels).encode()).hexdigest()

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "source": f"{len(self.images)} images in memory", "num_files": len(self.images)}


def _as_rgb(image: Any, i: int) -> Image.Image:
    if isinstance(image, Image.Image):
        return as_rgb8(_has_pixels(image, i))  # the pixels the same file would give
    arr = np.asarray(image)
    if arr.dtype != np.uint8 or arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[-1] not in (1, 3, 4)):
        raise VitscopeTypeError(f"image {i}: expected a PIL image or an H x W x 3 uint8 array, got "
                                f"{type(image).__name__} {getattr(arr, 'dtype', '')} {getattr(arr, 'shape', '')}")
    return as_rgb8(_has_pixels(Image.fromarray(arr.squeeze(-1) if arr.ndim == 3 and arr.shape[-1] == 1 else arr), i))


def _has_pixels(image: Image.Image, i: int) -> Image.Image:
    """``image`` when it holds a pixel (no file can hold an empty image, but an array can: the resize divided by
    its size)."""
    if 0 in image.size:
        raise VitscopeValueError(f"image {i} is empty ({image.size[1]} x {image.size[0]} pixels)")
    return image
