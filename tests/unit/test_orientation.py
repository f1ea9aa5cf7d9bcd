"""Annotations on stored pixels taken where the EXIF-oriented decode shows them, checked against Pillow's decode."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitscope.data.images import load_rgb
from vitscope.data.orientation import exif_orientation, orient_array, orient_points, oriented_hw


@pytest.mark.parametrize("orientation", range(1, 9))
def test_points_and_arrays_land_where_the_decoded_image_shows_them(orientation: int, tmp_path: Path) -> None:
    stored = np.random.default_rng(orientation).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x0112] = orientation
    path = tmp_path / "tagged.png"
    Image.fromarray(stored).save(path, exif=exif.tobytes())
    shown = np.asarray(load_rgb(path))
    assert exif_orientation(path) == orientation and shown.shape[:2] == oriented_hw((5, 7), orientation)
    np.testing.assert_array_equal(orient_array(stored.transpose(2, 0, 1), orientation).transpose(1, 2, 0), shown)
    np.testing.assert_array_equal(orient_array(shown.transpose(2, 0, 1), orientation, inverse=True),
                                  stored.transpose(2, 0, 1))
    ys, xs = np.mgrid[0:5, 0:7]
    points = np.stack([xs.ravel(), ys.ravel()], axis=1)
    moved = orient_points(points, (5, 7), orientation).astype(int)
    np.testing.assert_array_equal(shown[moved[:, 1], moved[:, 0]], stored[points[:, 1], points[:, 0]])


def test_no_tag_a_bad_tag_or_no_image_is_the_stored_orientation(tmp_path: Path) -> None:
    plain, odd, text = tmp_path / "plain.png", tmp_path / "odd.png", tmp_path / "text.png"
    Image.new("RGB", (4, 3)).save(plain)
    exif = Image.Exif()
    exif[0x0112] = 9
    Image.new("RGB", (4, 3)).save(odd, exif=exif.tobytes())
    text.write_text("not an image")
    assert [exif_orientation(p) for p in (plain, odd, text)] == [1, 1, 1]
