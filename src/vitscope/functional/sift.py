"""SIFT keypoints counted per patch (paper 003 section 2.2; docs/methods.md, SIFT patch interrelation).

OpenCV is imported lazily, so ``import vitscope`` works without it; only these functions need it
(``pip install opencv-python-headless``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from vitscope.errors import VitscopeValueError

__all__ = ["sift_keypoint_counts", "sift_keypoints"]


def _cv2():
    try:
        import cv2
    except ImportError:  # pragma: no cover - the dependency is declared in pyproject
        raise ImportError("SIFT keypoints need OpenCV: pip install opencv-python-headless") from None
    return cv2


def _check_image(image: np.ndarray) -> np.ndarray:
    arr = np.asarray(image)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3:
        raise VitscopeValueError(f"image must be an RGB uint8 array [H, W, 3], got {arr.dtype} {arr.shape}")
    return np.ascontiguousarray(arr)


def sift_keypoints(image: np.ndarray) -> np.ndarray:
    """OpenCV SIFT keypoints (default parameters) of an RGB image, on its grayscale version.

    Args:
        image: RGB ``uint8`` array ``[H, W, 3]`` (at model resolution, docs/methods.md, SIFT patch interrelation).

    Returns:
        ``[n, 2]`` float64 keypoint positions ``(x, y)`` in pixels.
    """
    cv2 = _cv2()
    gray = cv2.cvtColor(_check_image(image), cv2.COLOR_RGB2GRAY)
    points = cv2.SIFT_create().detect(gray, None)
    return np.array([kp.pt for kp in points], dtype=np.float64).reshape(-1, 2)


def sift_keypoint_counts(image: np.ndarray, grid: Sequence[int]) -> torch.Tensor:
    """Number of SIFT keypoints in every patch of an ``h x w`` grid.

    A keypoint at ``(x, y)`` counts in patch ``(min(floor(y / ph), h - 1), min(floor(x / pw), w - 1))``
    with ``ph = H / h`` and ``pw = W / w`` (docs/methods.md, SIFT patch interrelation).

    Args:
        image: RGB ``uint8`` array ``[H, W, 3]`` at model resolution.
        grid: ``(h, w)`` token grid.

    Returns:
        ``[h, w]`` int64 tensor of counts (sum = number of keypoints).
    """
    h, w = (int(v) for v in grid)
    if h < 1 or w < 1:
        raise VitscopeValueError(f"grid must be two positive sizes, got {tuple(grid)}")
    arr = _check_image(image)
    height, width = arr.shape[:2]
    pts = sift_keypoints(arr)
    counts = np.zeros((h, w), dtype=np.int64)
    if len(pts):
        rows = np.minimum(np.floor(pts[:, 1] / (height / h)).astype(np.int64), h - 1).clip(0)
        cols = np.minimum(np.floor(pts[:, 0] / (width / w)).astype(np.int64), w - 1).clip(0)
        np.add.at(counts, (rows, cols), 1)
    return torch.from_numpy(counts)
