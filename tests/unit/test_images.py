"""Tests for vitscope.data.images and vitscope.data.sample_photos."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFile, features

from vitscope.data.files import ImageFiles
from vitscope.data.images import (
    IMAGE_EXTENSIONS,
    EmptyDatasetError,
    ImageItem,
    ImageLoadError,
    SkippedImageWarning,
    load_rgb,
)
from vitscope.data.open import open_dataset
from vitscope.data.sample_photos import SAMPLE_PHOTO_NAMES, SamplePhotos


def _rgb(path: Path, size: tuple[int, int] = (8, 6), color: tuple[int, int, int] = (200, 30, 60)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fmt = {".jpg": "JPEG", ".jpeg": "JPEG", ".tif": "TIFF", ".tiff": "TIFF"}.get(path.suffix.lower())
    Image.new("RGB", size, color).save(path, format=fmt or path.suffix.lstrip(".").upper())
    return path


def _assert_rgb8(img: Image.Image, size: tuple[int, int] | None = None) -> np.ndarray:
    assert img.mode == "RGB"
    arr = np.asarray(img)
    assert arr.dtype == np.uint8 and arr.ndim == 3 and arr.shape[2] == 3
    if size is not None:
        assert img.size == size
    return arr


def _noise_jpeg_bytes(size: tuple[int, int] = (64, 64)) -> bytes:
    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    buffer = io.BytesIO()
    img.save(buffer, "JPEG", quality=95)
    return buffer.getvalue()


# ---------------------------------------------------------------- discovery


def test_folder_recursion_mixed_case_sorted_and_non_images_ignored(tmp_path: Path) -> None:
    expected = [
        _rgb(tmp_path / "a.jpg"),
        _rgb(tmp_path / "B.PNG"),
        _rgb(tmp_path / "sub" / "c.JpEg"),
        _rgb(tmp_path / "sub" / "deeper" / "d.TIFF"),
        _rgb(tmp_path / "z.Bmp"),
    ]
    (tmp_path / "notes.txt").write_text("not an image")
    (tmp_path / "sub" / "table.csv").write_text("a,b\n1,2\n")
    Image.new("RGB", (4, 4)).save(tmp_path / "sub" / "anim.gif")
    (tmp_path / "folder.jpg").mkdir()  # a directory with an image-like name is not a file

    ds = ImageFiles(tmp_path)
    relative = [Path(p).relative_to(tmp_path).as_posix() for p in ds.paths]
    assert relative == ["B.PNG", "a.jpg", "sub/c.JpEg", "sub/deeper/d.TIFF", "z.Bmp"]
    assert set(ds.paths) == {str(p) for p in expected}
    assert len(ds) == 5 and ds.name == tmp_path.name
    for i in range(len(ds)):
        item = ds.get(i)
        assert isinstance(item, ImageItem) and item.index == i and item.path == ds.paths[i]
        assert item.targets == {}
        _assert_rgb8(item.image, (8, 6))
    assert ds.skipped == []


def test_extensions_constant_and_custom_extensions(tmp_path: Path) -> None:
    assert IMAGE_EXTENSIONS == (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff")
    _rgb(tmp_path / "a.png")
    _rgb(tmp_path / "b.jpg")
    ds = ImageFiles(tmp_path, extensions=("PNG",))
    assert [Path(p).name for p in ds.paths] == ["a.png"]


def test_single_file_source_and_open_dataset_path(tmp_path: Path) -> None:
    path = _rgb(tmp_path / "only.png")
    ds = open_dataset(str(path))
    assert isinstance(ds, ImageFiles)
    assert ds.paths == [str(path)] and len(ds) == 1
    _assert_rgb8(ds.get(0).image)


def test_empty_folder_raises(tmp_path: Path) -> None:
    with pytest.raises(EmptyDatasetError, match=re.escape(str(tmp_path))) as info:
        ImageFiles(tmp_path)
    assert "\n" not in str(info.value)
    assert ".jpg" in str(info.value) and ".png" in str(info.value)


def test_folder_with_only_txt_files_raises(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hello")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("world")
    with pytest.raises(EmptyDatasetError, match="no images found"):
        ImageFiles(tmp_path)


def test_missing_source_raises_one_line_error(tmp_path: Path) -> None:
    missing = tmp_path / "does-not-exist"
    with pytest.raises(EmptyDatasetError) as info:
        ImageFiles(missing)
    assert isinstance(info.value, FileNotFoundError)
    assert str(missing) in str(info.value) and "\n" not in str(info.value)


def test_empty_path_list_raises() -> None:
    with pytest.raises(EmptyDatasetError):
        ImageFiles([])


def test_txt_list_with_relative_paths(tmp_path: Path) -> None:
    a = _rgb(tmp_path / "imgs" / "a.png", color=(1, 2, 3))
    b = _rgb(tmp_path / "imgs" / "nested" / "b.jpg")
    c = _rgb(tmp_path / "elsewhere" / "c.bmp", color=(9, 8, 7))
    listing = tmp_path / "lists" / "files.txt"
    listing.parent.mkdir()
    listing.write_text(f"# my images\n../imgs/a.png\n\n   ../imgs/nested/b.jpg  \n{c.resolve()}\n")

    ds = ImageFiles(listing)
    assert len(ds) == 3
    assert [Path(p).resolve() for p in ds.paths] == [a.resolve(), b.resolve(), c.resolve()]
    assert ds.get(0).image.getpixel((0, 0)) == (1, 2, 3)
    assert ds.get(2).image.getpixel((0, 0)) == (9, 8, 7)


def test_txt_list_with_only_comments_raises(tmp_path: Path) -> None:
    listing = tmp_path / "files.txt"
    listing.write_text("# nothing here\n\n")
    with pytest.raises(EmptyDatasetError):
        ImageFiles(listing)


def test_path_list_source_keeps_order(tmp_path: Path) -> None:
    paths = [_rgb(tmp_path / "z.png"), _rgb(tmp_path / "a.png")]
    ds = ImageFiles(paths)
    assert ds.paths == [str(p) for p in paths]
    assert ds.describe()["num_files"] == 2


def test_describe_fingerprint_stable_and_sensitive(tmp_path: Path) -> None:
    _rgb(tmp_path / "a.png")
    b = _rgb(tmp_path / "sub" / "b.png")
    first = ImageFiles(tmp_path).describe()
    assert set(first) == {"name", "source", "num_files", "fingerprint"}
    assert first["num_files"] == 2 and first["name"] == tmp_path.name
    assert re.fullmatch(r"[0-9a-f]{16}", first["fingerprint"])
    assert ImageFiles(tmp_path).describe()["fingerprint"] == first["fingerprint"]

    _rgb(b, size=(9, 9))  # new content (new size)
    os.utime(b, ns=(10**18, 10**18))
    changed = ImageFiles(tmp_path).describe()["fingerprint"]
    assert changed != first["fingerprint"]

    os.utime(b, ns=(2 * 10**18, 2 * 10**18))  # same size, new mtime
    assert ImageFiles(tmp_path).describe()["fingerprint"] != changed

    _rgb(tmp_path / "c.png")
    assert ImageFiles(tmp_path).describe()["num_files"] == 3


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
    arr = _assert_rgb8(out, (20, 40))
    assert arr[2, 10, 2] > 200 and arr[2, 10, 0] < 60  # blue now on top
    assert arr[37, 10, 0] > 200 and arr[37, 10, 2] < 60  # red at the bottom


def _save_grayscale(path: Path) -> None:
    Image.new("L", (5, 4), 77).save(path)


def _save_bilevel(path: Path) -> None:
    Image.new("1", (5, 4), 1).save(path)


def test_grayscale_and_bilevel(tmp_path: Path) -> None:
    _save_grayscale(tmp_path / "g.png")
    _save_bilevel(tmp_path / "b.png")
    assert _assert_rgb8(load_rgb(tmp_path / "g.png"), (5, 4))[0, 0].tolist() == [77, 77, 77]
    assert _assert_rgb8(load_rgb(tmp_path / "b.png"), (5, 4))[0, 0].tolist() == [255, 255, 255]


def test_palette_with_transparency_becomes_white(tmp_path: Path) -> None:
    img = Image.new("P", (4, 2), 0)
    img.putpalette([0, 0, 0, 255, 0, 0] + [0] * (256 * 3 - 6))
    img.putpixel((1, 0), 1)
    path = tmp_path / "pal.png"
    img.save(path, transparency=0)
    arr = _assert_rgb8(load_rgb(path), (4, 2))
    assert arr[0, 0].tolist() == [255, 255, 255]  # transparent black -> white
    assert arr[0, 1].tolist() == [255, 0, 0]


def test_palette_without_transparency(tmp_path: Path) -> None:
    img = Image.new("P", (3, 3), 1)
    img.putpalette([0, 0, 0, 10, 200, 30] + [0] * (256 * 3 - 6))
    path = tmp_path / "pal.bmp"
    img.save(path)
    assert _assert_rgb8(load_rgb(path))[1, 1].tolist() == [10, 200, 30]


def test_rgba_transparent_pixel_becomes_white(tmp_path: Path) -> None:
    img = Image.new("RGBA", (3, 1), (10, 20, 30, 255))
    img.putpixel((0, 0), (10, 20, 30, 0))
    img.putpixel((2, 0), (0, 0, 0, 128))
    path = tmp_path / "alpha.png"
    img.save(path)
    arr = _assert_rgb8(load_rgb(path), (3, 1))
    assert arr[0, 0].tolist() == [255, 255, 255]
    assert arr[0, 1].tolist() == [10, 20, 30]
    assert all(abs(int(v) - 127) <= 1 for v in arr[0, 2])  # half-transparent black over white


def test_la_transparent_pixel_becomes_white(tmp_path: Path) -> None:
    img = Image.new("LA", (2, 1), (40, 255))
    img.putpixel((0, 0), (0, 0))
    path = tmp_path / "la.png"
    img.save(path)
    arr = _assert_rgb8(load_rgb(path))
    assert arr[0, 0].tolist() == [255, 255, 255] and arr[0, 1].tolist() == [40, 40, 40]


def test_cmyk_jpeg(tmp_path: Path) -> None:
    path = tmp_path / "cmyk.jpg"
    Image.new("CMYK", (16, 16), (0, 255, 255, 0)).save(path, "JPEG", quality=95)
    with Image.open(path) as raw:
        assert raw.mode == "CMYK"
    r, g, b = _assert_rgb8(load_rgb(path), (16, 16))[8, 8].tolist()
    assert r > 200 and g < 60 and b < 60


@pytest.mark.parametrize("suffix", [".png", ".tif"])
def test_16bit_grayscale_scaled_not_clipped(tmp_path: Path, suffix: str) -> None:
    values = np.array([[0, 257, 32896, 65535]], dtype=np.uint16)
    path = tmp_path / f"deep{suffix}"
    Image.fromarray(values).save(path)
    with Image.open(path) as raw:
        assert raw.mode.startswith("I")
    arr = _assert_rgb8(load_rgb(path), (4, 1))
    assert arr[0, 0].tolist() == [0, 0, 0]
    assert arr[0, 1].tolist() == [1, 1, 1]
    assert abs(int(arr[0, 2, 0]) - 128) <= 1
    assert arr[0, 3].tolist() == [255, 255, 255]


def test_float_image_in_unit_range_is_scaled(tmp_path: Path) -> None:
    path = tmp_path / "float.tif"
    Image.fromarray(np.array([[0.0, 0.5, 1.0]], dtype=np.float32)).save(path)
    arr = _assert_rgb8(load_rgb(path))
    assert arr[0, :, 0].tolist() == [0, 128, 255]


@pytest.mark.parametrize("suffix", [".bmp", ".tiff", ".png", ".jpeg"])
def test_common_formats_load_as_rgb(tmp_path: Path, suffix: str) -> None:
    path = _rgb(tmp_path / f"img{suffix}", size=(7, 5), color=(200, 30, 60))
    pixel = _assert_rgb8(load_rgb(path), (7, 5))[2, 3].tolist()
    tolerance = 8 if suffix == ".jpeg" else 0
    assert all(abs(a - b) <= tolerance for a, b in zip(pixel, [200, 30, 60]))


@pytest.mark.skipif(not features.check("webp"), reason="Pillow built without WebP support")
def test_webp_loads_as_rgb(tmp_path: Path) -> None:
    path = tmp_path / "img.webp"
    img = Image.new("RGBA", (6, 4), (200, 30, 60, 255))
    img.putpixel((0, 0), (5, 5, 5, 0))
    img.save(path, "WEBP", lossless=True)
    arr = _assert_rgb8(load_rgb(path), (6, 4))
    assert arr[0, 0].tolist() == [255, 255, 255] and arr[2, 3].tolist() == [200, 30, 60]


def test_loaded_image_is_detached_from_file(tmp_path: Path) -> None:
    path = _rgb(tmp_path / "x.png")
    img = load_rgb(path)
    path.unlink()
    assert img.getpixel((0, 0)) == (200, 30, 60)


# ---------------------------------------------------------------- bad files


@pytest.fixture
def bad_files(tmp_path: Path) -> dict[str, Path]:
    good = _rgb(tmp_path / "good.png")
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    garbage = tmp_path / "garbage.png"
    garbage.write_bytes(b"this is definitely not a PNG file\n" * 20)
    data = _noise_jpeg_bytes()
    truncated = tmp_path / "truncated.jpg"
    truncated.write_bytes(data[: len(data) // 2])
    return {"good": good, "empty": empty, "garbage": garbage, "truncated": truncated}


@pytest.mark.parametrize("kind", ["empty", "garbage", "truncated"])
def test_bad_file_skipped_with_warning(bad_files: dict[str, Path], kind: str) -> None:
    bad = bad_files[kind]
    ds = ImageFiles([bad_files["good"], bad])
    assert ds.get(0) is not None
    with pytest.warns(SkippedImageWarning, match=re.escape(bad.name)):
        assert ds.get(1) is None
    assert [s.path for s in ds.skipped] == [str(bad)]
    reason = ds.skipped[0].reason
    assert reason and "\n" not in reason
    assert ds.get(1) is None  # second call does not duplicate the entry
    assert len(ds.skipped) == 1
    assert [item.path for item in ds] == [str(bad_files["good"])]


def test_bad_file_reasons(bad_files: dict[str, Path]) -> None:
    reasons = {}
    for kind in ("empty", "garbage", "truncated"):
        with pytest.raises(ImageLoadError) as info:
            load_rgb(bad_files[kind])
        reasons[kind] = info.value.reason
    assert reasons["empty"] == "empty file"
    assert "cannot identify image file" in reasons["garbage"]
    assert "truncated" in reasons["truncated"].lower() and "JPEG" in reasons["truncated"]


@pytest.mark.parametrize("kind", ["empty", "garbage", "truncated"])
def test_bad_file_strict_raises_one_line_error(bad_files: dict[str, Path], kind: str) -> None:
    bad = bad_files[kind]
    ds = ImageFiles([bad_files["good"], bad], strict=True)
    assert ds.strict is True
    with pytest.raises(ImageLoadError) as info:
        ds.get(1)
    message = str(info.value)
    assert bad.name in message and "\n" not in message
    assert ds.skipped == []


def test_truncated_fails_even_if_pillow_tolerates_truncation(
    bad_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(ImageLoadError, match="truncated"):
        load_rgb(bad_files["truncated"])
    assert ImageFile.LOAD_TRUNCATED_IMAGES is True  # global restored


def test_missing_listed_file_is_skipped(tmp_path: Path) -> None:
    ds = ImageFiles([tmp_path / "gone.png"])
    with pytest.warns(SkippedImageWarning, match="gone.png"):
        assert ds.get(0) is None
    assert ds.skipped[0].path == str(tmp_path / "gone.png")


def test_get_out_of_range(tmp_path: Path) -> None:
    ds = ImageFiles([_rgb(tmp_path / "a.png")])
    assert ds.get(-1).index == 0
    with pytest.raises(IndexError):
        ds.get(1)


# ---------------------------------------------------------------- sample photos


def test_sample_photos_all_rgb() -> None:
    ds = SamplePhotos()
    assert 6 <= len(ds) <= 10 and len(ds) == len(SAMPLE_PHOTO_NAMES)
    assert ds.name == "skimage" and ds.strict is False
    assert ds.paths == [f"skimage:{n}" for n in SAMPLE_PHOTO_NAMES]
    for i in range(len(ds)):
        item = ds.get(i)
        assert item is not None and item.path == ds.paths[i] and item.index == i
        arr = _assert_rgb8(item.image)
        assert min(arr.shape[:2]) >= 64
    assert ds.skipped == []
    info = ds.describe()
    assert info["name"] == "skimage" and info["num_files"] == len(ds)
    assert re.fullmatch(r"[0-9a-f]{16}", info["fingerprint"])
    assert SamplePhotos().describe()["fingerprint"] == info["fingerprint"]


def test_sample_photos_selection_and_limit() -> None:
    ds = SamplePhotos(names=["chelsea", "astronaut"])
    assert ds.paths == ["skimage:chelsea", "skimage:astronaut"]
    assert ds.get(1).image.size == (512, 512)
    assert len(SamplePhotos(limit=3)) == 3
    with pytest.raises(ValueError, match="not_a_photo"):
        SamplePhotos(names=["not_a_photo"])


def test_open_dataset_skimage() -> None:
    ds = open_dataset("skimage")
    assert isinstance(ds, SamplePhotos) and len(ds) == len(SAMPLE_PHOTO_NAMES)
    _assert_rgb8(ds.get(0).image)
    two = open_dataset("skimage:astronaut,chelsea", strict=True)
    assert isinstance(two, SamplePhotos) and two.strict
    assert two.paths == ["skimage:astronaut", "skimage:chelsea"]
    assert two.describe()["fingerprint"] != ds.describe()["fingerprint"]
