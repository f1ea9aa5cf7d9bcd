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


def test_user_text_with_dollar_pairs_is_drawn_as_written(tmp_path):
    # file, class and model names may hold "$...$": matplotlib would parse them as math and fail on unknown commands
    fig = Figure(figsize=(3, 2))
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1], label="run_$\\bad$")
    ax.set_title("a_$\\badcmd$.jpg")
    ax.set_xticks([0, 1], ["$\\nosuch$", "b_$x^2$"])
    ax.legend()
    paths = save_figure(fig, tmp_path / "dollars", svg=True)
    assert [p.name for p in paths] == ["dollars.png", "dollars.svg"]
    assert all(p.stat().st_size > 0 for p in paths)


def test_compare_figures_tell_apart_models_past_the_ten_colours(tmp_path, monkeypatch):
    from vitscope.viz import comparison_figures

    seen = []
    monkeypatch.setattr(comparison_figures, "save_figure", lambda fig, stem: seen.append(fig) or [])
    curves = {f"model {k}": ([0.0, 1.0], [k, k + 1.0]) for k in range(12)}
    comparison_figures.model_curves(curves, "CKA", "CKA", tmp_path / "cka")
    looks = [(line.get_color(), line.get_marker(), line.get_linestyle()) for line in seen[0].axes[0].get_lines()]
    assert len(looks) == 12 and len(set(looks)) == 12, looks
    assert looks[10][0] == looks[0][0]  # the colour repeats, the marker and the line do not
