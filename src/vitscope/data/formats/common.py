"""Helpers shared by the dataset format readers and writers.

Every reader is a :class:`LazyDataset`: construction reads only the index (folder listings, annotation
files) and never decodes an image; items are :class:`~vitscope.data.items.AnnotatedImage` records holding
the image *path*. A missing image file is reported when its item is accessed (``dataset[i]``), as a
one-line :class:`DatasetFileNotFoundError` naming the entry; a corrupt image is reported when it is decoded
(:meth:`LazyDataset.load_image`, or downstream by :func:`vitscope.data.images.load_rgb`).
"""

from __future__ import annotations

import json
import operator
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from vitscope.atomic import atomic_path
from vitscope.data.formats.errors import DatasetFormatError
from vitscope.data.formats.errors import safe_join as _safe_join
from vitscope.data.items import AnnotatedImage
from vitscope.errors import VitscopeTypeError, VitscopeValueError

__all__ = [
    "DatasetFileNotFoundError",
    "DatasetFormatError",
    "LazyDataset",
    "image_suffix",
    "mask_to_box",
    "read_json",
    "require_file",
    "safe_join",
    "save_image",
    "save_jpeg",
    "save_png",
]

PathLike = str | os.PathLike


def one_line(text: object) -> str:
    """Collapse ``text`` to a single line (error messages must stay one line)."""
    return " ".join(str(text).split())


class DatasetFileNotFoundError(DatasetFormatError, FileNotFoundError):
    """A file the dataset needs (annotation file, image named by an entry) does not exist."""


def safe_join(root: PathLike, relative: str, entry_desc: str) -> Path:
    """Join ``relative`` (a path read from an annotation file) under ``root``, refusing escapes.

    The check is lexical (no file-system access, so symlinked image folders keep working) and shared with
    the other readers (:func:`vitscope.data.formats.errors.safe_join`): empty, absolute and drive-letter
    paths and any ``..`` component are refused.

    Args:
        root: dataset folder the path must stay inside.
        relative: path as written in the annotation (``/`` separated).
        entry_desc: what names the entry in the error, e.g. ``"image entry 3 (id 7) of instances_val2017.json"``.

    Returns:
        ``root / relative``.

    Raises:
        DatasetFormatError: one line naming the entry and the offending path.
    """
    if not isinstance(relative, str):
        raise DatasetFormatError(f"{entry_desc}: file name must be a string, got {relative!r}")
    return _safe_join(root, relative, entry_desc)


def require_file(path: Path, entry_desc: str) -> Path:
    """Return ``path`` if it is an existing file, else raise a one-line error naming the entry."""
    if not path.is_file():
        raise DatasetFileNotFoundError(f"{entry_desc}: image file not found: {path}")
    return path


def read_json(path: PathLike) -> Any:
    """Parse a JSON file.

    Raises:
        DatasetFileNotFoundError: the file does not exist.
        DatasetFormatError: it is not valid UTF-8 JSON (the message names the file and the position).
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetFileNotFoundError(f"annotation file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise DatasetFormatError(f"malformed JSON in {path}: {e.msg} at line {e.lineno} column {e.colno}") from None
    except UnicodeDecodeError as e:
        raise DatasetFormatError(f"malformed JSON in {path}: not UTF-8 text ({e.reason})") from None
    except RecursionError:  # arrays or objects nested deeper than Python's parser recurses
        raise DatasetFormatError(f"malformed JSON in {path}: nested too deeply to be an annotation file") from None


def mask_to_box(mask: np.ndarray) -> np.ndarray:
    """Box of a mask in the vitscope convention.

    Args:
        mask: ``[H, W]`` bool (or anything where nonzero counts as inside).

    Returns:
        ``[4]`` float32 ``[x1, y1, x2, y2]``, 0-based, x2/y2 exclusive; all zeros for an empty mask.
    """
    mask = np.asarray(mask).astype(bool)
    if mask.ndim != 2:
        raise VitscopeValueError(f"mask_to_box expects an [H, W] mask, got shape {mask.shape}")
    rows = np.flatnonzero(mask.any(axis=1))
    if rows.size == 0:
        return np.zeros(4, dtype=np.float32)
    cols = np.flatnonzero(mask.any(axis=0))
    return np.array([cols[0], rows[0], cols[-1] + 1, rows[-1] + 1], dtype=np.float32)


def _as_uint8_image(array: np.ndarray) -> Image.Image:
    array = np.asarray(array)
    if array.dtype != np.uint8:
        raise VitscopeValueError(f"images are written from uint8 arrays, got dtype {array.dtype}")
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if not (array.ndim == 2 or (array.ndim == 3 and array.shape[2] in (3, 4))):
        raise VitscopeValueError(f"images are [H, W], [H, W, 3] or [H, W, 4] arrays, got shape {array.shape}")
    return Image.fromarray(array)


def save_png(array: np.ndarray, path: PathLike) -> Path:
    """Write a uint8 ``[H, W]``, ``[H, W, 3]`` or ``[H, W, 4]`` array as a (lossless) PNG; creates folders."""
    path = Path(path)
    with atomic_path(path) as tmp:
        _as_uint8_image(array).save(tmp, format="PNG")
    return path


def save_jpeg(array: np.ndarray, path: PathLike, quality: int = 95) -> Path:
    """Write a uint8 ``[H, W]`` or ``[H, W, 3]`` array as a JPEG (lossy); creates folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    img = _as_uint8_image(array)
    if img.mode == "RGBA":
        img = img.convert("RGB")
    with atomic_path(path) as tmp:
        img.save(tmp, format="JPEG", quality=quality)
    return path


def save_image(array: np.ndarray, path: PathLike) -> Path:
    """Write with the encoder chosen by the suffix of ``path`` (``.png``, or ``.jpg`` / ``.jpeg``)."""
    suffix = Path(path).suffix.lower()
    if suffix == ".png":
        return save_png(array, path)
    if suffix in (".jpg", ".jpeg"):
        return save_jpeg(array, path)
    raise VitscopeValueError(f"cannot choose an encoder for {path}: use .png, .jpg or .jpeg")


def image_suffix(image_format: str) -> str:
    """Map ``"png"`` / ``"jpg"`` / ``"jpeg"`` (any case) to a file suffix, rejecting anything else."""
    fmt = image_format.lower().lstrip(".")
    if fmt not in ("png", "jpg", "jpeg"):
        raise VitscopeValueError(f"image_format must be 'png' or 'jpg', got {image_format!r}")
    return "." + fmt


class LazyDataset(Sequence, ABC):
    """Base of the format readers: a sequence of :class:`AnnotatedImage` built on access.

    Subclasses implement ``__len__`` and ``_get(i)`` (``0 <= i < len``); this class handles ``int``
    indices (negative ones count from the end), slices (a list of items) and iteration. No image is
    decoded up front; :meth:`load_image` decodes one on request.

    Attributes:
        name: short description, e.g. ``"coco:val2017"``.
        root: dataset folder.
    """

    name: str = "dataset"

    def __init__(self, root: PathLike, name: str) -> None:
        self.root = Path(root)
        self.name = name

    @abstractmethod
    def __len__(self) -> int:
        """Number of items."""

    @abstractmethod
    def _get(self, index: int) -> AnnotatedImage:
        """Item ``index`` with ``0 <= index < len(self)``."""

    def __getitem__(self, index):  # type: ignore[override]
        """Item ``index`` (negative counts from the end) or a list of items for a slice."""
        if isinstance(index, slice):
            return [self._get(i) for i in range(*index.indices(len(self)))]
        try:
            i = operator.index(index)
        except TypeError:
            raise VitscopeTypeError(f"{self.name}: indices must be integers or slices, not "
                                    f"{type(index).__name__}") from None
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"{self.name}: index {index} out of range for {n} items")
        return self._get(i)

    def __iter__(self) -> Iterator[AnnotatedImage]:
        for i in range(len(self)):
            yield self._get(i)

    def load_image(self, index: int) -> Image.Image:
        """Decode the image of item ``index`` to 8-bit RGB (raises ``ImageLoadError`` naming the file)."""
        from vitscope.data.images import load_rgb

        return load_rgb(self[index].image_path)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, root={str(self.root)!r}, len={len(self)})"
