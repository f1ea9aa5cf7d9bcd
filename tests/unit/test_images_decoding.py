"""Tests for decoding in vitscope.data.images.load_rgb: EXIF orientation, grayscale, bilevel, palette, alpha,
CMYK, 16-bit and float images, and the common file formats, all to 8-bit RGB. Discovery, bad files and sample
photos are in test_images.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image, features

from helpers.images import assert_rgb8, save_rgb
from vitscope.data.images import load_rgb

# ---------------------------------------------------------------- decoding


def test_exif_orientation_is_applied(tmp_path: Path) -> None:
    img = Image.new("RGB", (40, 20), (255, 0, 0))
    img.paste((0, 0, 255), (0, 0, 20, 20))  # left half blue
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    path = tmp_path / "rotated.jpg"
    img.save(path, "JPEG", exif=exif.tobytes(), quality=95)
    with Image.open(path) as raw:
        assert raw.size == (40, 20)  # stored unrotated

    out = load_rgb(path)
    arr = assert_rgb8(out, (20, 40))
    assert arr[2, 10, 2] > 200 and arr[2, 10, 0] < 60  # blue now on top
    assert arr[37, 10, 0] > 200 and arr[37, 10, 2] < 60  # red at the bottom


def _save_grayscale(path: Path) -> None:
    Image.new("L", (5, 4), 77).save(path)


def _save_bilevel(path: Path) -> None:
    Image.new("1", (5, 4), 1).save(path)


def test_grayscale_and_bilevel(tmp_path: Path) -> None:
    _save_grayscale(tmp_path / "g.png")
    _save_bilevel(tmp_path / "b.png")
    assert assert_rgb8(load_rgb(tmp_path / "g.png"), (5, 4))[0, 0].tolist() == [77, 77, 77]
    assert assert_rgb8(load_rgb(tmp_path / "b.png"), (5, 4))[0, 0].tolist() == [255, 255, 255]


def test_palette_with_transparency_becomes_white(tmp_path: Path) -> None:
    img = Image.new("P", (4, 2), 0)
    img.putpalette([0, 0, 0, 255, 0, 0] + [0] * (256 * 3 - 6))
    img.putpixel((1, 0), 1)
    path = tmp_path / "pal.png"
    img.save(path, transparency=0)
    arr = assert_rgb8(load_rgb(path), (4, 2))
    assert arr[0, 0].tolist() == [255, 255, 255]  # transparent black -> white
    assert arr[0, 1].tolist() == [255, 0, 0]


def test_palette_without_transparency(tmp_path: Path) -> None:
    img = Image.new("P", (3, 3), 1)
    img.putpalette([0, 0, 0, 10, 200, 30] + [0] * (256 * 3 - 6))
    path = tmp_path / "pal.bmp"
    img.save(path)
    assert assert_rgb8(load_rgb(path))[1, 1].tolist() == [10, 200, 30]


def test_rgba_transparent_pixel_becomes_white(tmp_path: Path) -> None:
    img = Image.new("RGBA", (3, 1), (10, 20, 30, 255))
    img.putpixel((0, 0), (10, 20, 30, 0))
    img.putpixel((2, 0), (0, 0, 0, 128))
    path = tmp_path / "alpha.png"
    img.save(path)
    arr = assert_rgb8(load_rgb(path), (3, 1))
    assert arr[0, 0].tolist() == [255, 255, 255]
    assert arr[0, 1].tolist() == [10, 20, 30]
    assert all(abs(int(v) - 127) <= 1 for v in arr[0, 2])  # half-transparent black over white


def test_la_transparent_pixel_becomes_white(tmp_path: Path) -> None:
    img = Image.new("LA", (2, 1), (40, 255))
    img.putpixel((0, 0), (0, 0))
    path = tmp_path / "la.png"
    img.save(path)
    arr = assert_rgb8(load_rgb(path))
    assert arr[0, 0].tolist() == [255, 255, 255] and arr[0, 1].tolist() == [40, 40, 40]


def test_cmyk_jpeg(tmp_path: Path) -> None:
    path = tmp_path / "cmyk.jpg"
    Image.new("CMYK", (16, 16), (0, 255, 255, 0)).save(path, "JPEG", quality=95)
    with Image.open(path) as raw:
        assert raw.mode == "CMYK"
    r, g, b = assert_rgb8(load_rgb(path), (16, 16))[8, 8].tolist()
    assert r > 200 and g < 60 and b < 60


@pytest.mark.parametrize("suffix", [".png", ".tif"])
def test_16bit_grayscale_scaled_not_clipped(tmp_path: Path, suffix: str) -> None:
    values = np.array([[0, 257, 32896, 65535]], dtype=np.uint16)
    path = tmp_path / f"deep{suffix}"
    Image.fromarray(values).save(path)
    with Image.open(path) as raw:
        assert raw.mode.startswith("I")
    arr = assert_rgb8(load_rgb(path), (4, 1))
    assert arr[0, 0].tolist() == [0, 0, 0]
    assert arr[0, 1].tolist() == [1, 1, 1]
    assert abs(int(arr[0, 2, 0]) - 128) <= 1
    assert arr[0, 3].tolist() == [255, 255, 255]


def test_float_image_in_unit_range_is_scaled(tmp_path: Path) -> None:
    path = tmp_path / "float.tif"
    Image.fromarray(np.array([[0.0, 0.5, 1.0]], dtype=np.float32)).save(path)
    arr = assert_rgb8(load_rgb(path))
    assert arr[0, :, 0].tolist() == [0, 128, 255]


@pytest.mark.parametrize("suffix", [".bmp", ".tiff", ".png", ".jpeg"])
def test_common_formats_load_as_rgb(tmp_path: Path, suffix: str) -> None:
    path = save_rgb(tmp_path / f"img{suffix}", size=(7, 5), color=(200, 30, 60))
    pixel = assert_rgb8(load_rgb(path), (7, 5))[2, 3].tolist()
    tolerance = 8 if suffix == ".jpeg" else 0
    assert all(abs(a - b) <= tolerance for a, b in zip(pixel, [200, 30, 60]))


@pytest.mark.skipif(not features.check("webp"), reason="Pillow built without WebP support")
def test_webp_loads_as_rgb(tmp_path: Path) -> None:
    path = tmp_path / "img.webp"
    img = Image.new("RGBA", (6, 4), (200, 30, 60, 255))
    img.putpixel((0, 0), (5, 5, 5, 0))
    img.save(path, "WEBP", lossless=True)
    arr = assert_rgb8(load_rgb(path), (6, 4))
    assert arr[0, 0].tolist() == [255, 255, 255] and arr[2, 3].tolist() == [200, 30, 60]


def test_loaded_image_is_detached_from_file(tmp_path: Path) -> None:
    path = save_rgb(tmp_path / "x.png")
    img = load_rgb(path)
    path.unlink()
    assert img.getpixel((0, 0)) == (200, 30, 60)
