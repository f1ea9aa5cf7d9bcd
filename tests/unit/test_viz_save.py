"""Figures are written as PNG, and as SVG too only when they are drawn with lines and small heatmaps."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from vitscope.viz.save import RASTER_PIXELS, is_vector, save_figure


def test_curves_and_small_heatmaps_get_an_svg_photographs_do_not(tmp_path) -> None:
    curve = Figure()
    ax = curve.add_subplot()
    ax.plot([0, 1, 2], [1, 0, 1])
    ax.imshow(np.zeros((12, 6)))  # a blocks x heads heatmap
    assert is_vector(curve)
    assert [p.suffix for p in save_figure(curve, tmp_path / "curve")] == [".png", ".svg"]
    photo = Figure()
    side = int(np.sqrt(RASTER_PIXELS)) + 1
    photo.add_subplot().imshow(np.zeros((side, side, 3), dtype=np.uint8))
    assert not is_vector(photo)
    paths = save_figure(photo, tmp_path / "sub" / "photo.png")  # a .png suffix is taken as the stem's
    assert paths == [tmp_path / "sub" / "photo.png"] and paths[0].stat().st_size > 0
    forced = Figure()
    forced.add_subplot().imshow(np.zeros((side, side)))
    assert [p.suffix for p in save_figure(forced, tmp_path / "forced", svg=True)] == [".png", ".svg"]
