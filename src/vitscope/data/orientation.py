"""Geometry annotated on an image's stored pixels, taken to where the decoded image shows it.

Every source decodes an image EXIF-oriented (:func:`vitscope.data.images.load_rgb`), so a model sees the oriented
picture. Annotations made on the stored pixels (SPair keypoints, DAVIS masks) must go through the same rotation or
flip: :func:`exif_orientation` reads the tag as the decoder does, :func:`orient_points` and :func:`orient_array`
apply it (and undo it, for predictions written back in the stored frame). Keypoints are pixel positions: a point
on stored pixel ``(x, y)`` lands on the pixel that shows it.
"""

from __future__ import annotations

import os

import numpy as np
from PIL import Image

__all__ = ["TRANSPOSED", "exif_orientation", "image_orientation", "orient_array", "orient_points", "oriented_hw"]

_TAG = 0x0112
_INVERSE = {6: 8, 8: 6}  # the two quarter turns undo each other; the flips and the half turn undo themselves
#: EXIF orientations that swap width and height
TRANSPOSED = frozenset({5, 6, 7, 8})


def image_orientation(img: Image.Image) -> int:
    """The EXIF orientation (1..8) of an opened image, as the decoder applies it: 1 without a tag or with a
    malformed one (the image is then shown as stored)."""
    try:
        value = img.getexif().get(_TAG, 1)
    except Exception:  # malformed EXIF
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def exif_orientation(path: str | os.PathLike) -> int:
    """:func:`image_orientation` of an image file; 1 for a file that is not an image (it then fails where it is
    decoded)."""
    try:
        with Image.open(path) as img:
            return image_orientation(img)
    except Exception:  # not an image
        return 1


def oriented_hw(stored_hw: tuple[int, int], orientation: int) -> tuple[int, int]:
    """``(height, width)`` of the oriented image whose stored pixels are ``stored_hw``."""
    h, w = stored_hw
    return (w, h) if orientation in TRANSPOSED else (h, w)


def orient_points(xy: np.ndarray, stored_hw: tuple[int, int], orientation: int) -> np.ndarray:
    """``[n, 2]`` (x, y) pixels of the stored image -> where the oriented image shows them (float64).

    Args:
        xy: ``[n, 2]`` pixel positions on the stored image.
        stored_hw: ``(height, width)`` of the stored image.
        orientation: the EXIF orientation (1..8, :func:`exif_orientation`).
    """
    pts = np.asarray(xy, dtype=np.float64).reshape(-1, 2)
    x, y = pts[:, 0], pts[:, 1]
    right, bottom = stored_hw[1] - 1 - x, stored_hw[0] - 1 - y  # the mirrored pixel positions
    out = {1: (x, y), 2: (right, y), 3: (right, bottom), 4: (x, bottom), 5: (y, x), 6: (bottom, x),
           7: (bottom, right), 8: (y, right)}[orientation]
    return np.stack(out, axis=1)


def orient_array(array: np.ndarray, orientation: int, inverse: bool = False) -> np.ndarray:
    """``[..., H, W]`` values on the stored pixels (masks) -> on the oriented image's pixels, as the decoder turns
    the image; ``inverse=True`` takes values on the oriented image back to the stored pixels."""
    if inverse:
        orientation = _INVERSE.get(orientation, orientation)
    a = np.asarray(array)
    turned = {1: a, 2: a[..., :, ::-1], 3: a[..., ::-1, ::-1], 4: a[..., ::-1, :], 5: np.swapaxes(a, -1, -2),
              6: np.rot90(a, -1, axes=(-2, -1)), 7: np.swapaxes(a[..., ::-1, ::-1], -1, -2),
              8: np.rot90(a, 1, axes=(-2, -1))}[orientation]
    return np.ascontiguousarray(turned)
