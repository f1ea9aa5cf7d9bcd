"""docs/errors.md, images: each bad or unusual image file, run through ``vitscope analyze`` as a user would."""

from __future__ import annotations

import os

import numpy as np
from PIL import Image

from helpers.bad_input import (
    analyze,
    finished,
    folder_with_one_good_image,
    one_error,
    picture,
    png_header,
    skipped,
    warned,
)
from vitscope.data.images import load_rgb


def test_image_corrupt(tmp_path):
    data = folder_with_one_good_image(tmp_path)
    (data / "noise.jpg").write_bytes(os.urandom(300))
    result = analyze(data, tmp_path / "out")
    doc = finished(result, tmp_path / "out")
    assert "noise.jpg" in warned(result, "skipping image") and doc["num_images"] == 1
    assert skipped(doc) == {"noise.jpg": "cannot identify image file"}


def test_image_truncated(tmp_path):
    data = folder_with_one_good_image(tmp_path)
    whole = picture(tmp_path / "whole.png", size=(64, 64)).read_bytes()
    (data / "cut.png").write_bytes(whole[: len(whole) // 2])
    doc = finished(analyze(data, tmp_path / "out"), tmp_path / "out")
    assert skipped(doc) == {"cut.png": "truncated PNG file"} and doc["num_images"] == 1


def test_image_zero_bytes(tmp_path):
    data = folder_with_one_good_image(tmp_path)
    (data / "empty.png").write_bytes(b"")
    doc = finished(analyze(data, tmp_path / "out"), tmp_path / "out")
    assert skipped(doc) == {"empty.png": "empty file"}


def test_image_decompression_bomb(tmp_path):
    data = folder_with_one_good_image(tmp_path)
    (data / "bomb.png").write_bytes(png_header(40_000, 40_000))  # 1.6 gigapixels declared in 100 bytes
    result = analyze(data, tmp_path / "out")
    doc = finished(result, tmp_path / "out")
    assert "decompression-bomb" in skipped(doc)["bomb.png"] and doc["num_images"] == 1


def test_image_very_large(tmp_path):
    data = folder_with_one_good_image(tmp_path)
    (data / "huge.png").write_bytes(png_header(12_000, 12_000))  # over Pillow's warning size, under its refusal
    result = analyze(data, tmp_path / "out")
    line = warned(result, "large image")
    assert "huge.png" in line and "12000x12000" in line and "decompression bomb" not in result.stderr


def test_image_one_pixel(tmp_path):
    data = folder_with_one_good_image(tmp_path)
    Image.new("RGB", (1, 1), (200, 10, 10)).save(data / "dot.png")
    doc = finished(analyze(data, tmp_path / "out"), tmp_path / "out")
    assert doc["num_images"] == 2 and doc["skipped"] == []


def test_image_animated_gif(tmp_path):
    data = folder_with_one_good_image(tmp_path)
    frames = [Image.new("RGB", (30, 20), colour) for colour in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
    frames[0].save(data / "anim.gif", save_all=True, append_images=frames[1:])
    doc = finished(analyze(data, tmp_path / "out"), tmp_path / "out")
    assert doc["num_images"] == 2
    assert load_rgb(data / "anim.gif").getpixel((5, 5)) == (255, 0, 0)  # the first frame


def test_image_multipage_tiff(tmp_path):
    data = folder_with_one_good_image(tmp_path)
    pages = [Image.new("RGB", (30, 20), colour) for colour in ((0, 0, 255), (0, 255, 0))]
    pages[0].save(data / "pages.tiff", save_all=True, append_images=pages[1:])
    doc = finished(analyze(data, tmp_path / "out"), tmp_path / "out")
    assert doc["num_images"] == 2 and load_rgb(data / "pages.tiff").getpixel((5, 5)) == (0, 0, 255)


def test_image_cmyk_16bit_palette_alpha(tmp_path):
    data = folder_with_one_good_image(tmp_path)
    Image.new("CMYK", (20, 20), (0, 255, 255, 0)).save(data / "cmyk.jpg")
    Image.fromarray(np.full((20, 20), 65535, dtype=np.uint16)).save(data / "deep.png")
    palette = Image.new("P", (20, 20), 0)
    palette.putpalette([0, 0, 0] * 256)
    palette.save(data / "palette.png", transparency=0)
    Image.new("RGBA", (20, 20), (0, 0, 0, 0)).save(data / "alpha.png")
    doc = finished(analyze(data, tmp_path / "out"), tmp_path / "out")
    assert doc["num_images"] == 5 and doc["skipped"] == []
    red = load_rgb(data / "cmyk.jpg").getpixel((5, 5))
    assert red[0] > 200 and red[1] < 60 and red[2] < 60
    assert load_rgb(data / "deep.png").getpixel((5, 5)) == (255, 255, 255)  # 16 bits scaled, not clipped
    assert load_rgb(data / "palette.png").getpixel((5, 5)) == (255, 255, 255)  # transparent -> white
    assert load_rgb(data / "alpha.png").getpixel((5, 5)) == (255, 255, 255)


def test_image_exif_rotation(tmp_path):
    data = folder_with_one_good_image(tmp_path)
    exif = Image.Exif()
    exif[0x0112] = 6  # displayed rotated by 90 degrees
    Image.new("RGB", (40, 20), (255, 0, 0)).save(data / "phone.jpg", exif=exif.tobytes())
    doc = finished(analyze(data, tmp_path / "out"), tmp_path / "out")
    assert doc["num_images"] == 2 and load_rgb(data / "phone.jpg").size == (20, 40)


def test_image_directory_named_like_an_image(tmp_path):
    data = folder_with_one_good_image(tmp_path)
    (data / "album.jpg").mkdir()
    result = analyze(data, tmp_path / "out")
    doc = finished(result, tmp_path / "out")
    assert doc["num_images"] == 1 and doc["skipped"] == [] and "album" not in result.stderr


def test_image_non_utf8_file_name(tmp_path):
    data = folder_with_one_good_image(tmp_path)
    os.link(data / "good.png", os.path.join(os.fsencode(data), b"caf\xe9.png"))  # Latin-1 bytes in the name
    out = tmp_path / "out"
    doc = finished(analyze(data, out), out)
    assert doc["num_images"] == 2 and (out / "report.html").stat().st_size > 0


def test_image_very_long_file_name(tmp_path):
    data = folder_with_one_good_image(tmp_path)
    picture(data / ("x" * 250 + ".png"))
    doc = finished(analyze(data, tmp_path / "out"), tmp_path / "out")
    assert doc["num_images"] == 2


def test_image_symlink_loop(tmp_path):
    data = folder_with_one_good_image(tmp_path)
    (data / "again").symlink_to(data, target_is_directory=True)
    doc = finished(analyze(data, tmp_path / "out"), tmp_path / "out")
    assert doc["num_images"] == 1  # the folder is read once


def test_image_linked_folder(tmp_path):
    data = folder_with_one_good_image(tmp_path)
    picture(tmp_path / "elsewhere" / "far.png")
    (data / "more").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    doc = finished(analyze(data, tmp_path / "out"), tmp_path / "out")
    assert doc["num_images"] == 2


def test_image_broken_link(tmp_path):
    data = folder_with_one_good_image(tmp_path)
    (data / "gone.png").symlink_to(tmp_path / "deleted.png")
    result = analyze(data, tmp_path / "out")
    doc = finished(result, tmp_path / "out")
    assert skipped(doc)["gone.png"].startswith("broken symbolic link") and "gone.png" in warned(result, "skipping")


def test_image_unreadable_under_strict(tmp_path):
    data = folder_with_one_good_image(tmp_path)
    (data / "noise.png").write_bytes(b"not a picture")
    out = tmp_path / "out"
    one_error(analyze(data, out, "--strict"), "noise.png: cannot identify image file")
    assert not (out / "results.json").exists()


def test_data_folder_without_images(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("no pictures here")
    one_error(analyze(tmp_path / "notes", tmp_path / "out"), "no images found in folder")


def test_data_missing(tmp_path):
    one_error(analyze(tmp_path / "nowhere", tmp_path / "out"), "not found")


def test_data_every_image_unreadable(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "a.png").write_bytes(b"junk")
    one_error(analyze(tmp_path / "bad", tmp_path / "out"), "no readable image among 1 files")


def test_data_html_in_file_names_and_terminal_control_characters(tmp_path):
    """A file name (or a model name) holding escape sequences reached the terminal: it could clear the screen,
    retitle the window or forge a link. Every line of text vitscope did not write shows them as escapes."""
    data = folder_with_one_good_image(tmp_path)
    (data / "clear\x1b[2J\x1b]0;title\x07.png").write_bytes(b"junk")
    result = analyze(data, tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr
    assert r"clear\x1b[2J\x1b]0;title\x07.png" in warned(result, "skipping image")


def test_data_html_in_file_names(tmp_path):
    data = folder_with_one_good_image(tmp_path, name="<img src=x onerror=alert(1)>")
    (data / '"><svg onload=alert(2)>.png').write_bytes(b"junk")  # skipped: named in the report's skipped list
    out = tmp_path / "out"
    finished(analyze(data, out), out)
    html = (out / "report.html").read_text()
    assert "<img src=x onerror" not in html and "<svg onload" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and "&lt;svg onload=alert(2)&gt;" in html
