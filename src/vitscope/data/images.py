"""Robust decoding of images to 8-bit RGB (``load_rgb``, ``decode_rgb``; optionally drafted JPEGs), and the records
of what could not be read."""

from __future__ import annotations

import os
import stat
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import BinaryIO

import numpy as np
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from vitscope.data.orientation import TRANSPOSED, image_orientation
from vitscope.errors import VitscopeError, VitscopeValueError

PathLike = str | os.PathLike

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff", ".gif")  # GIF/TIFF: first frame

_ALPHA_MODES = frozenset({"RGBA", "RGBa", "LA", "La", "PA"})
_MAX_REASON_CHARS = 160


@dataclass
class ImageItem:
    """One loaded image: ``image`` is always 8-bit ``"RGB"``; ``targets`` holds ground truth, if any."""

    image: Image.Image
    path: str  # source path, or a pseudo-path such as "skimage:astronaut"
    index: int  # position in the dataset
    targets: dict = field(default_factory=dict)


@dataclass
class SkippedImage:
    """A file that could not be loaded; ``reason`` is one line, e.g. ``"truncated JPEG file"``."""

    path: str
    reason: str


class ImageLoadError(VitscopeError):
    """A file could not be read as an image; the message is one line naming the file."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = str(path)
        self.reason = one_line(reason)
        super().__init__(one_line(f"cannot read {self.path}: {self.reason}"))

    def __reduce__(self):  # keep the exception picklable across worker processes
        return (type(self), (self.path, self.reason))


class EmptyDatasetError(VitscopeValueError):
    """No candidate image files were found; the message says where and which extensions count."""


class DatasetNotFoundError(EmptyDatasetError, FileNotFoundError):
    """The dataset source (folder, list file or image) does not exist."""


class SkippedImageWarning(UserWarning):
    """Warned once per unreadable file that a non-strict dataset skips."""


class LargeImageWarning(UserWarning):
    """An image above Pillow's decompression-bomb warning size (``Image.MAX_IMAGE_PIXELS``): it is decoded whole,
    at a memory cost, before it is resized; above twice that size it is refused as a bomb."""


def one_line(text: str) -> str:
    """Collapse ``text`` to a single line."""
    return " ".join(str(text).split())


def _short_reason(err: BaseException) -> str:
    """Return a short, single-line description of ``err``."""
    reason = one_line(err) or type(err).__name__
    return reason if len(reason) <= _MAX_REASON_CHARS else reason[: _MAX_REASON_CHARS - 3] + "..."


_truncation_lock = threading.Lock()
_truncation_state = {"depth": 0, "saved": False}


@contextmanager
def _reject_truncated_images() -> Iterator[None]:
    """Force ``ImageFile.LOAD_TRUNCATED_IMAGES = False`` while decoding (restored afterwards).

    Another library may have switched it on, making Pillow pad truncated files with grey.
    The reference count keeps concurrent loads consistent.
    """
    with _truncation_lock:
        if _truncation_state["depth"] == 0:
            _truncation_state["saved"] = ImageFile.LOAD_TRUNCATED_IMAGES
        _truncation_state["depth"] += 1
        ImageFile.LOAD_TRUNCATED_IMAGES = False
    try:
        yield
    finally:
        with _truncation_lock:
            _truncation_state["depth"] -= 1
            if _truncation_state["depth"] == 0:
                ImageFile.LOAD_TRUNCATED_IMAGES = _truncation_state["saved"]


def _check_file(path: str) -> None:
    """Raise ``ImageLoadError`` if ``path`` is missing, not a regular file or empty."""
    try:
        info = os.stat(path)
    except OSError as err:
        reason = "file not found" if isinstance(err, FileNotFoundError) else _short_reason(err)
        if isinstance(err, FileNotFoundError) and os.path.islink(path):
            reason = f"broken symbolic link to {os.readlink(path)}"
        raise ImageLoadError(path, reason) from None
    if stat.S_ISDIR(info.st_mode):
        raise ImageLoadError(path, "is a directory")
    if info.st_size == 0:
        raise ImageLoadError(path, "empty file")


def _apply_exif_orientation(img: Image.Image) -> Image.Image:
    """Rotate/flip ``img`` per its EXIF Orientation; malformed EXIF leaves it as stored."""
    try:
        return ImageOps.exif_transpose(img)
    except Exception:
        return img


def _scale_high_bit_depth(img: Image.Image) -> Image.Image:
    """Map a 16-bit, 32-bit integer or float single-channel image to 8-bit ``"L"``.

    ``I;16*`` uses the full 16-bit range (divide by 257, so 65535 -> 255). For ``"I"``
    and ``"F"`` the actual value range decides: [0, 1] floats scale by 255, [0, 255]
    is kept, [0, 65535] is treated as 16-bit, anything else is min-max normalised.
    """
    arr = np.nan_to_num(np.asarray(img).astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    lo, hi = (float(arr.min()), float(arr.max())) if arr.size else (0.0, 0.0)
    if img.mode.startswith("I;16") or (lo >= 0 and 255 < hi <= 65535):
        scaled = arr / 257.0
    elif lo >= 0 and hi <= 1 and img.mode == "F":
        scaled = arr * 255.0
    elif lo >= 0 and hi <= 255:
        scaled = arr
    else:
        scaled = (arr - lo) / (hi - lo) * 255.0 if hi > lo else np.zeros_like(arr)
    return Image.fromarray(np.clip(np.rint(scaled), 0, 255).astype(np.uint8))


def _composite_on_white(img: Image.Image) -> Image.Image:
    """Flatten an image with alpha onto white.

    Fully transparent pixels have undefined (often black or garbage) colour values that
    dropping alpha would expose; white is the conventional page/viewer backdrop.
    """
    rgba = img.convert("RGBA")
    background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(background, rgba).convert("RGB")


def _to_rgb8(img: Image.Image) -> Image.Image:
    """Convert a decoded image of any supported mode to 8-bit RGB."""
    if img.mode == "RGB":
        return img
    if img.mode.startswith("I") or img.mode == "F":
        return _scale_high_bit_depth(img).convert("RGB")
    if img.mode == "P" or img.mode in _ALPHA_MODES or "transparency" in img.info:
        return _composite_on_white(img)
    return img.convert("RGB")  # L, 1, CMYK, YCbCr, ...; unsupported modes raise ValueError


def as_rgb8(img: Image.Image) -> Image.Image:
    """An image already opened (``PIL.Image.open``, or built in memory) as every file is read: EXIF-oriented,
    alpha on white, 16-bit and float scaled to 8 bits, in mode ``"RGB"`` (an upright RGB image is returned as it
    is, without a copy)."""
    return _to_rgb8(_apply_exif_orientation(img) if image_orientation(img) != 1 else img)


def _warn_if_large(path: str, img: Image.Image) -> None:
    pixels = img.width * img.height
    if Image.MAX_IMAGE_PIXELS and pixels > Image.MAX_IMAGE_PIXELS:
        warnings.warn(LargeImageWarning(
            f"large image {path}: {img.width}x{img.height} ({pixels / 1e6:.0f} megapixels) is decoded whole before "
            f"resizing, about {3 * pixels / 2**20:.0f} MB"), stacklevel=3)


def load_rgb(path: PathLike) -> Image.Image:
    """Open, fully decode, EXIF-orient and convert an image file to 8-bit RGB.

    Args:
        path: Image file path.

    Returns:
        A new ``PIL.Image`` in mode ``"RGB"``, detached from the file.

    Raises:
        ImageLoadError: If the file is missing, empty, not an image, corrupt or truncated.
    """
    path_str = os.fspath(path)
    _check_file(path_str)
    return decode_rgb(path_str, path_str)


def decode_rgb(file: str | BinaryIO, name: str) -> Image.Image:
    """Decode an image (a path or a binary file object: the bytes of a dataset row or a tar member) to 8-bit RGB,
    EXIF-oriented, the one way every source decodes (with a JPEG drafted to a smaller scale inside
    :func:`jpeg_drafting`).

    Args:
        file: what to open; name: how errors name it (a path, ``shard.tar:key``...).

    Returns:
        A new ``PIL.Image`` in mode ``"RGB"``, detached from the file.

    Raises:
        ImageLoadError: not an image, corrupt or truncated.
    """
    fmt = "image"
    try:
        with _reject_truncated_images(), Image.open(file) as img:
            fmt = img.format or fmt
            _warn_if_large(name, img)
            full = _draft(img)
            img.load()
            out = _to_rgb8(_apply_exif_orientation(img))
            out = out.copy() if out is img else out
            if full is not None:
                out.info[_FULL_SIZE] = full
            return out
    except UnidentifiedImageError:
        raise ImageLoadError(name, "cannot identify image file") from None
    except Image.DecompressionBombError:
        raise ImageLoadError(name, "image exceeds Pillow's decompression-bomb limit") from None
    except Exception as err:  # decoders raise OSError, SyntaxError, ValueError, ...
        if "truncated" in str(err).lower():
            raise ImageLoadError(name, f"truncated {fmt} file") from err
        raise ImageLoadError(name, _short_reason(err)) from err


#: inside :func:`jpeg_drafting`: ``(height, width) -> (height, width)``, the size an image is resized to next (a
#: context variable: two runs in threads of one process draft each by its own rule)
_DRAFT_TARGET: ContextVar[Callable[[tuple[int, int]], tuple[int, int]] | None] = ContextVar("vitscope_jpeg_draft",
                                                                                           default=None)


@contextmanager
def jpeg_drafting(resized_to: Callable[[tuple[int, int]], tuple[int, int]]) -> Iterator[None]:
    """Inside, JPEGs decode at the smallest DCT scale (1/2, 1/4, 1/8: libjpeg's, through Pillow's ``draft``) that
    still gives at least the size the image is resized to next, ``resized_to((height, width))`` of the oriented
    image. Much faster for images far larger than the model's input; the pixels differ from a full decode (a
    different downscaling filter), so runs record that they drafted. It holds in this thread's context: worker
    processes forked inside inherit it, and a thread decoding for it runs in a copy of the context
    (``contextvars.copy_context().run``, as the engine's loading thread does).
    """
    token = _DRAFT_TARGET.set(resized_to)
    try:
        yield
    finally:
        _DRAFT_TARGET.reset(token)


#: ``Image.info`` key of a drafted image: the oriented ``(height, width)`` a full decode would have had
_FULL_SIZE = "vitscope_full_size"


def full_size(image: Image.Image) -> tuple[int, int]:
    """``(height, width)`` of ``image`` decoded in full: the size before a drafted decode shrank it, else its own.

    Geometry (the resize, the crop, a keep-aspect grid) follows this size, so a drafted JPEG lands on the grid and
    crop of its full decode; only the pixels differ.
    """
    size = image.info.get(_FULL_SIZE)
    return (int(size[0]), int(size[1])) if size is not None else (image.height, image.width)


def oriented_size(path: PathLike) -> tuple[int, int]:
    """``(height, width)`` of an image file as it is shown (its EXIF orientation applied), from its header alone.

    Raises:
        ImageLoadError: not an image.
    """
    try:
        with Image.open(path) as img:
            height, width = img.height, img.width
            turned = image_orientation(img) in TRANSPOSED
    except (OSError, UnidentifiedImageError) as err:
        raise ImageLoadError(os.fspath(path), _short_reason(err)) from None
    return (width, height) if turned else (height, width)


def _draft(img: Image.Image) -> tuple[int, int] | None:
    """Ask a JPEG's decoder for a reduced scale when :func:`jpeg_drafting` is on (before ``load``); returns the
    oriented ``(height, width)`` of the full decode when a smaller scale was taken."""
    target = _DRAFT_TARGET.get()
    if target is None or img.format != "JPEG":
        return None
    height, width = img.height, img.width
    transposed = image_orientation(img) in TRANSPOSED
    if transposed:
        height, width = width, height
    new_h, new_w = target((height, width))
    if transposed:
        new_h, new_w = new_w, new_h
    img.draft("RGB", (max(int(new_w), 1), max(int(new_h), 1)))
    drafted = (img.width, img.height) if transposed else (img.height, img.width)
    return (height, width) if drafted != (height, width) else None
