"""Small image files and RGB checks shared by the tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def save_rgb(path: Path, size: tuple[int, int] = (8, 6), color: tuple[int, int, int] = (200, 30, 60)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fmt = {".jpg": "JPEG", ".jpeg": "JPEG", ".tif": "TIFF", ".tiff": "TIFF"}.get(path.suffix.lower())
    Image.new("RGB", size, color).save(path, format=fmt or path.suffix.lstrip(".").upper())
    return path


def assert_rgb8(img: Image.Image, size: tuple[int, int] | None = None) -> np.ndarray:
    assert img.mode == "RGB"
    arr = np.asarray(img)
    assert arr.dtype == np.uint8 and arr.ndim == 3 and arr.shape[2] == 3
    if size is not None:
        assert img.size == size
    return arr


def random_pngs(folder: Path, sizes: list[tuple[int, int]], seed: int = 0, prefix: str = "img") -> Path:
    """``<prefix><i>.png`` of uniform random RGB noise, one per ``(height, width)`` in ``sizes``; returns ``folder``."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i, size in enumerate(sizes):
        Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(folder / f"{prefix}{i}.png")
    return folder
