"""Explanation figures: how maps are drawn over images, every figure writes a PNG."""

import numpy as np
import pytest
import torch
from PIL import Image

from vitscope.viz import explain_figures as ef


def test_heat_overlay_colours_the_high_corner_and_leaves_the_low_one_grey():
    img = np.zeros((16, 16, 3), dtype=np.uint8)
    img[..., 0] = 120  # a red photo: shown in grey under the map
    m = torch.zeros(4, 4)
    m[0, 0] = 1.0
    out = ef.heat_overlay(img, m).astype(int)
    assert out.shape == (16, 16, 3)
    assert out[0, 0, 0] > out[0, 0, 2] + 60 and out[0, 0, 1] > 100  # hot corner: inferno's yellow
    assert np.abs(out[15, 15] - 40).max() <= 3  # cold corner: the photo's grey (120 / 3), hardly tinted


def test_figures_are_written(tmp_path):
    from vitscope.explain.explained_retrieval import RetrievalExplanation

    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (5, 3, 16, 16), dtype=torch.uint8, generator=gen)
    maps = torch.rand(2, 2, 4, 4, generator=gen)
    res = RetrievalExplanation(torch.tensor([0, 1]), torch.tensor([[2, 3], [4, 0]]), torch.rand(2, 2),
                               torch.tensor([[True, False], [False, True]]), maps, maps)
    paths = [
        ef.pair_figure(images[0], images[1], maps[0, 0], maps[0, 1], 0.5, tmp_path / "pair.png",
                       maps[1, 0], maps[1, 1]),
        ef.retrieval_figure(images, {"vit": res, "resnet": res}, tmp_path / "retrieval.png"),
        ef.class_maps_figure(images, [0, 1], maps[0], tmp_path / "class.png"),
        ef.models_figure(images[0], [images[1], images[2]], {"@step0": maps[0], "final": maps[1]},
                         tmp_path / "models.png", {"@step0": [0.1, 0.2], "final": [0.3, 0.4]}),
        ef.faithfulness_figure(torch.linspace(0, 1, 3), {"paired": {"deletion": torch.rand(2, 3)}}, tmp_path / "f.png"),
        ef.pose_similarity_figure({"vit": [0.5, 0.4], "resnet": [0.3, 0.3]}, tmp_path / "pose.png"),
    ]
    for p in paths:
        assert p.is_file() and Image.open(p).size[0] > 50


@pytest.mark.parametrize("shape", [(3, 8, 8), (8, 8, 3)])
def test_to_rgb_accepts_both_layouts(shape):
    assert ef.to_rgb(np.zeros(shape, dtype=np.uint8)).shape == (8, 8, 3)


def test_signed_overlay_is_red_where_a_patch_adds_blue_where_it_takes_and_grey_at_zero():
    import numpy as np

    from vitscope.viz.explain_figures import signed_overlay

    image = np.full((40, 40, 3), 128, dtype=np.uint8)
    grid = np.zeros((4, 4), dtype=np.float32)
    grid[0, 0], grid[3, 3] = 1.0, -1.0
    out = signed_overlay(image, grid, limit=1.0).astype(int)
    top_left, bottom_right, middle = out[2, 2], out[37, 37], out[20, 20]
    assert top_left[0] > top_left[2] + 40  # red
    assert bottom_right[2] > bottom_right[0] + 40  # blue
    assert abs(middle[0] - middle[2]) <= 6 and abs(middle[0] - 128) <= 12  # about the grey image
    assert np.array_equal(signed_overlay(image, grid * 2, limit=2.0), signed_overlay(image, grid, limit=1.0))


def test_the_colour_bar_says_how_far_its_ends_are_from_the_even_share():
    assert ef.spread_text(0.01, 0.0001) == "ends \u00b11 % of it"
    assert ef.spread_text(-0.01, 0.062) == "ends \u00b1620 % of it"  # never 6.2e+02
    assert ef.spread_text(0.0, 1.0) == "centre 0"


def test_faithfulness_legend_area_is_over_the_shares_the_steps_removed(monkeypatch, tmp_path):
    drawn = []
    monkeypatch.setattr(ef, "save_figure", lambda fig, path, **kw: drawn.append(fig) or [path])
    curve = torch.tensor([[1.0, 0.0, 0.0]])  # the score falls to 0 once a tenth of the patches are gone
    ef.faithfulness_figure(torch.tensor([0.0, 0.1, 1.0]), {"map": {"deletion": curve}}, tmp_path / "f.png")
    labels = [t.get_text() for t in drawn[0].axes[0].get_legend().get_texts()]
    assert labels == ["map (area 0.050)"]  # evenly spaced steps would say 0.250


def test_deletion_chart_ticks_are_the_exact_shares_removed():
    from vitscope.workflows.explanations import _curves_figure

    figure = _curves_figure("m", {"attention": {"deletion_mean": torch.rand(9)}}, 8, 196)
    ticks = figure.chart.panels[0].x_ticks
    assert ticks[:3] == ["0.000", "0.122", "0.250"]  # round(196 / 8) = 24 of 196 patches, not 1/8
    assert ticks[-1] == "1.000"
