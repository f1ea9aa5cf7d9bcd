"""Raster figures without matplotlib figures: colour lookup, tile placement, files written."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
from PIL import Image

from vitscope.viz.attention_maps import _map_grid, aligned_maps_figure, block_head_maps, rollout_figure
from vitscope.viz.raster import Canvas, colorize, fit_nearest, font, tile_scale, upscale


def test_colorize_matches_matplotlib_at_the_ends_and_blanks_nan() -> None:
    rgb = colorize(np.array([0.0, 1.0, np.nan, 5.0]), "inferno")
    ref = (np.array(matplotlib.colormaps["inferno"]([0.0, 1.0]))[:, :3] * 255 + 0.5).astype(np.uint8)
    assert (rgb[:2] == ref).all()
    assert tuple(rgb[2]) == (255, 255, 255)
    assert (rgb[3] == ref[1]).all()  # above vmax: clipped to the top colour


def test_tile_scale_and_upscale() -> None:
    assert tile_scale(14, 14) == 3 and tile_scale(37, 37) == 1 and tile_scale(4, 2) == 12
    up = upscale(np.arange(4, dtype=np.uint8).reshape(2, 2, 1), 3)
    assert up.shape == (6, 6, 1) and up[5, 0, 0] == 2 and up[0, 5, 0] == 1
    assert fit_nearest(np.array([[1, 2], [3, 4]]), (4, 4))[3, 3] == 4


def test_each_tile_shows_its_own_map_at_its_block_and_head() -> None:
    rows, cols, a, b = 3, 4, 5, 6
    maps = np.zeros((rows, cols, a, b))
    for i in range(rows):
        for j in range(cols):
            maps[i, j, i, j] = 1.0  # one bright token per tile, somewhere else in each
    canvas = Canvas(1200, 800)
    right, bottom = _map_grid(canvas, maps, 10, 40, [str(i) for i in range(rows)], "viridis")
    scale, gap = tile_scale(a, b), 2
    gx, gy = right - (cols * (b * scale + gap) - gap), bottom - (rows * (a * scale + gap) - gap)
    image = np.asarray(canvas.image)
    top, low = colorize(np.array([1.0]), "viridis")[0], colorize(np.array([0.0]), "viridis")[0]
    for i in range(rows):
        for j in range(cols):
            ty, tx = gy + i * (a * scale + gap), gx + j * (b * scale + gap)
            hot = image[ty + i * scale + scale // 2, tx + j * scale + scale // 2]
            cold = image[ty + ((i + 2) % a) * scale + scale // 2, tx + ((j + 3) % b) * scale + scale // 2]
            assert (hot == top).all(), (i, j)
            assert (cold == low).all(), (i, j)


def test_grid_and_rollout_figures_write_one_png_each(tmp_path) -> None:
    rng = np.random.default_rng(0)
    photo = rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)
    maps = rng.random((2, 3, 4, 4))
    assert [p.name for p in block_head_maps(maps, "maps", tmp_path / "g", image=photo)] == ["g.png"]
    assert [p.name for p in aligned_maps_figure(rng.random((2, 3, 7, 7)), [["global"] * 3] * 2, "a",
                                                tmp_path / "a")] == ["a.png"]
    out = rollout_figure(photo[None], rng.random((1, 4, 4)), [7], rng.random((4, 4)), rng.random((4, 4)), "r",
                         tmp_path / "r")
    for p in (tmp_path / "g.png", tmp_path / "a.png", *out):
        with Image.open(p) as im:
            assert im.width > 100 and im.height > 60 and im.mode == "RGB"
    with pytest.raises(ValueError, match=r"\[L, H, a, b\]"):
        block_head_maps(maps[0], "bad", tmp_path / "bad")


def test_rollout_overlays_keep_the_images_aspect_ratio(tmp_path, monkeypatch) -> None:
    """A 40 x 96 image (a 5 x 12 grid under --keep-aspect) is drawn 75 x 180, its map over it the same size."""
    from vitscope.viz import attention_maps

    shapes = []
    overlay = attention_maps.value_overlay
    monkeypatch.setattr(attention_maps, "value_overlay",
                        lambda photo, m, cmap: shapes.append((photo.shape[:2], m.shape)) or overlay(photo, m, cmap))
    rng = np.random.default_rng(2)
    photo = rng.integers(0, 255, (40, 96, 3), dtype=np.uint8)
    rollout_figure(photo[None], rng.random((1, 5, 12)), [0], rng.random((5, 12)), None, "r", tmp_path / "r")
    assert shapes == [((75, 180), (75, 180))]


def test_a_grid_wider_than_the_first_guess_is_drawn_whole(tmp_path) -> None:
    rng = np.random.default_rng(1)
    maps = rng.random((24, 16, 14, 14))
    maps[:, -1] = 0.0
    maps[:, -1, 0, 0] = 1.0  # the last head's tiles: one bright token at their top-left corner
    photo = rng.integers(0, 255, (224, 896, 3), dtype=np.uint8)  # a wide input beside the grid
    (path,) = block_head_maps(maps, "wide", tmp_path / "wide", block_labels=[f"block-{i}" for i in range(24)],
                              image=photo)
    with Image.open(path) as im:
        pixels = np.asarray(im.convert("RGB"))
    top = colorize(np.array([1.0]), "inferno")[0]
    found = np.argwhere((pixels == top).all(-1))
    assert found.size and found[:, 1].max() > pixels.shape[1] - 60  # the last head reaches the right edge
    assert pixels.shape[1] > 16 * (14 * 3 + 2) + 320  # grid plus photo: nothing was cut


@pytest.mark.parametrize("letter", ["ï", "é", "ß", "Ω", "Ж"])
def test_raster_text_draws_letters_beyond_ascii(letter: str) -> None:
    # a letter the font lacks draws as the same box as an unassigned code point
    def drawn(text: str) -> tuple:
        mask = font(14).getmask(text)
        return mask.size, bytes(mask)

    assert drawn(letter) != drawn("\u0378")
