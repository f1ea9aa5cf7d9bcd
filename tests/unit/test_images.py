"""Tests for image datasets: discovery, listing and fingerprints in vitscope.data.files.ImageFiles, bad files
(skipped with a warning or strict) from vitscope.data.images, and vitscope.data.sample_photos. Decoding of
modes and formats by load_rgb is in test_images_decoding.py."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFile

from helpers.images import assert_rgb8, save_rgb
from vitscope.data.files import ImageFiles
from vitscope.data.images import (
    IMAGE_EXTENSIONS,
    EmptyDatasetError,
    ImageItem,
    ImageLoadError,
    SkippedImageWarning,
    load_rgb,
)
from vitscope.data.open import as_source
from vitscope.data.sample_photos import SAMPLE_PHOTO_NAMES, SamplePhotos


def _noise_jpeg_bytes(size: tuple[int, int] = (64, 64)) -> bytes:
    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    buffer = io.BytesIO()
    img.save(buffer, "JPEG", quality=95)
    return buffer.getvalue()


# ---------------------------------------------------------------- discovery


def test_folder_recursion_mixed_case_sorted_and_non_images_ignored(tmp_path: Path) -> None:
    expected = [
        save_rgb(tmp_path / "a.jpg"),
        save_rgb(tmp_path / "B.PNG"),
        save_rgb(tmp_path / "sub" / "c.JpEg"),
        save_rgb(tmp_path / "sub" / "deeper" / "d.TIFF"),
        save_rgb(tmp_path / "z.Bmp"),
    ]
    (tmp_path / "notes.txt").write_text("not an image")
    (tmp_path / "sub" / "table.csv").write_text("a,b\n1,2\n")
    (tmp_path / "sub" / "drawing.svg").write_text("<svg/>")  # vector images are not read
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
        assert_rgb8(item.image, (8, 6))
    assert ds.skipped == []


def test_extensions_constant_and_custom_extensions(tmp_path: Path) -> None:
    assert IMAGE_EXTENSIONS == (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff", ".gif")
    save_rgb(tmp_path / "a.png")
    save_rgb(tmp_path / "b.jpg")
    ds = ImageFiles(tmp_path, extensions=("PNG",))
    assert [Path(p).name for p in ds.paths] == ["a.png"]


def test_single_file_source_and_as_source_path(tmp_path: Path) -> None:
    path = save_rgb(tmp_path / "only.png")
    ds = as_source(str(path))
    assert isinstance(ds, ImageFiles)
    assert ds.paths == [str(path)] and len(ds) == 1
    assert_rgb8(ds.get(0).image)


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
    a = save_rgb(tmp_path / "imgs" / "a.png", color=(1, 2, 3))
    b = save_rgb(tmp_path / "imgs" / "nested" / "b.jpg")
    c = save_rgb(tmp_path / "elsewhere" / "c.bmp", color=(9, 8, 7))
    listing = tmp_path / "lists" / "files.txt"
    listing.parent.mkdir()
    listing.write_text(f"# my images\n../imgs/a.png\n\n   ../imgs/nested/b.jpg  \n{c.resolve()}\n")

    ds = ImageFiles(listing)
    assert len(ds) == 3
    assert [Path(p).resolve() for p in ds.paths] == [a.resolve(), b.resolve(), c.resolve()]
    assert ds.get(0).image.getpixel((0, 0)) == (1, 2, 3)
    assert ds.get(2).image.getpixel((0, 0)) == (9, 8, 7)


def test_lists_saved_with_a_byte_order_mark_are_read_whole(tmp_path: Path) -> None:
    """Windows editors start UTF-8 files with U+FEFF: the first path (and label) must not carry it."""
    from vitscope.data.load import load_dataset

    a = save_rgb(tmp_path / "a.png", color=(1, 2, 3))
    save_rgb(tmp_path / "b.png")
    (tmp_path / "files.txt").write_text("a.png\nb.png\n", encoding="utf-8-sig")
    (tmp_path / "labelled.txt").write_text("a.png 1\nb.png 0\n", encoding="utf-8-sig")
    ds = ImageFiles(tmp_path / "files.txt")
    assert Path(ds.paths[0]).resolve() == a.resolve() and ds.get(0).image.getpixel((0, 0)) == (1, 2, 3)
    labelled = load_dataset(tmp_path / "labelled.txt", "list")
    assert Path(labelled[0].image_path).resolve() == a.resolve() and list(labelled.labels) == [1, 0]


def test_txt_list_with_only_comments_raises(tmp_path: Path) -> None:
    listing = tmp_path / "files.txt"
    listing.write_text("# nothing here\n\n")
    with pytest.raises(EmptyDatasetError):
        ImageFiles(listing)


def test_path_list_source_keeps_order(tmp_path: Path) -> None:
    paths = [save_rgb(tmp_path / "z.png"), save_rgb(tmp_path / "a.png")]
    ds = ImageFiles(paths)
    assert ds.paths == [str(p) for p in paths]
    assert ds.describe()["num_files"] == 2


def test_describe_fingerprint_stable_and_sensitive(tmp_path: Path) -> None:
    save_rgb(tmp_path / "a.png")
    b = save_rgb(tmp_path / "sub" / "b.png")
    first = ImageFiles(tmp_path).describe()
    assert set(first) == {"name", "source", "num_files", "format", "label_rule", "fingerprint"}
    assert first["num_files"] == 2 and first["name"] == tmp_path.name
    assert re.fullmatch(r"[0-9a-f]{16}", first["fingerprint"])
    assert ImageFiles(tmp_path).describe()["fingerprint"] == first["fingerprint"]

    save_rgb(b, size=(9, 9))  # new content (new size)
    os.utime(b, ns=(10**18, 10**18))
    changed = ImageFiles(tmp_path).describe()["fingerprint"]
    assert changed != first["fingerprint"]

    os.utime(b, ns=(2 * 10**18, 2 * 10**18))  # same size, new mtime
    assert ImageFiles(tmp_path).describe()["fingerprint"] != changed

    save_rgb(tmp_path / "c.png")
    assert ImageFiles(tmp_path).describe()["num_files"] == 3


# ---------------------------------------------------------------- bad files


@pytest.fixture
def bad_files(tmp_path: Path) -> dict[str, Path]:
    good = save_rgb(tmp_path / "good.png")
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
    ds = ImageFiles([save_rgb(tmp_path / "a.png")])
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
        arr = assert_rgb8(item.image)
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


def test_as_source_skimage() -> None:
    ds = as_source("skimage")
    assert isinstance(ds, SamplePhotos) and len(ds) == len(SAMPLE_PHOTO_NAMES)
    assert_rgb8(ds.get(0).image)
    two = as_source("skimage:astronaut,chelsea", strict=True)
    assert isinstance(two, SamplePhotos) and two.strict
    assert two.paths == ["skimage:astronaut", "skimage:chelsea"]
    assert two.describe()["fingerprint"] != ds.describe()["fingerprint"]


def test_an_opened_image_and_an_array_give_the_pixels_of_their_file(tmp_path: Path) -> None:
    """Transparent pixels go on white and 16 bits scale by 1/257 whether vitscope reads the file, holds the opened
    image in memory or preprocesses it (a plain convert('RGB') kept the hidden colour and clipped 16 bits)."""
    from vitscope.data.memory import InMemoryImages
    from vitscope.models.preprocess import to_pil

    rgba = np.zeros((4, 4, 4), dtype=np.uint8)
    rgba[..., 0] = 255  # red, fully transparent: white when read from the file
    rgba[0, 0, 3] = 255  # one opaque red pixel
    Image.fromarray(rgba, "RGBA").save(tmp_path / "alpha.png")
    Image.fromarray(np.full((4, 4), 51400, dtype=np.uint16)).save(tmp_path / "deep.png")
    for name, want in (("alpha.png", [(255, 0, 0), (255, 255, 255)]), ("deep.png", [(200, 200, 200)] * 2)):
        from_file = load_rgb(tmp_path / name)
        assert [from_file.getpixel(xy) for xy in ((0, 0), (1, 1))] == want, name
        with Image.open(tmp_path / name) as opened:
            held = InMemoryImages([opened]).load(0)
            converted = to_pil(opened)
        for image in (held, converted):
            assert image.mode == "RGB" and image.tobytes() == from_file.tobytes(), name
    array = InMemoryImages([rgba]).load(0)
    assert array.getpixel((1, 1)) == (255, 255, 255) and array.getpixel((0, 0)) == (255, 0, 0)


def test_a_txt_of_path_label_lines_is_read_as_the_list_format(tmp_path: Path) -> None:
    """What `vitscope synth --format list` writes: labels read, not glued onto the paths (every image was skipped
    as 'file not found'); a plain list of paths, even with spaces in its names, stays a list of paths."""
    from vitscope.data import as_source

    a = save_rgb(tmp_path / "images" / "a.png", color=(1, 2, 3))
    save_rgb(tmp_path / "images" / "b c.png")
    (tmp_path / "labelled.txt").write_text("# path label\nimages/a.png 3\nimages/b c.png 1\n")
    (tmp_path / "plain.txt").write_text("images/b c.png\nimages/a.png\n")
    labelled = as_source(tmp_path / "labelled.txt")
    assert len(labelled) == 2 and labelled.labels().tolist() == [3, 1] and labelled.get(0).image.getpixel((0, 0)) == (
        1, 2, 3) and labelled.targets(1) == {"label": 1}
    plain = as_source(str(tmp_path / "plain.txt"))
    assert [Path(p).name for p in plain.paths] == ["b c.png", "a.png"] and Path(plain.paths[1]) == a
