"""Several models' per-block probe curves (``models_probe_curves``): each model at its own blocks, beside its own
random-chance score."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import vitscope.viz.probe_figures as pf
import vitscope.viz.representation_figures as rf
from vitscope.analyses.probes.result import probe_result


@pytest.fixture
def drawn(monkeypatch) -> dict[str, object]:
    """The matplotlib figures handed to ``save_figure``, by file stem (nothing is written)."""
    figures: dict[str, object] = {}

    def save(fig, stem, **kw) -> list[Path]:
        figures[Path(stem).name] = fig
        return [Path(stem)]

    monkeypatch.setattr(pf, "save_figure", save, raising=False)
    monkeypatch.setattr(rf, "save_figure", save)
    return figures


@pytest.mark.parametrize("vit_blocks", [6, 4])  # a deeper model than the CNN's 4 stages, and one as deep
def test_each_model_is_drawn_at_its_own_blocks_with_its_own_random_chance(drawn, tmp_path, vit_blocks) -> None:
    vit = probe_result("knn_probe", "knn", list(range(vit_blocks)), {"accuracy": [.2, .3, .4, .5, .6, .7][:vit_blocks]},
                       {"accuracy": 0.0})
    cnn = probe_result("knn_probe", "knn", [0, 1, 2, 3], {"accuracy": [.3, .4, .5, .6]}, {"accuracy": 0.111})
    pf.models_probe_curves({"vit": {"knn": vit}, "cnn": {"knn": cnn}}, tmp_path)
    ax = drawn["compare_knn_accuracy"].axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["vit"].get_xdata()) == list(range(vit_blocks)) and list(lines["cnn"].get_xdata()) == [0, 1, 2, 3]
    np.testing.assert_allclose(lines["cnn"].get_ydata(), [.3, .4, .5, .6])
    for model, random in (("vit", 0.0), ("cnn", 0.111)):  # dashed, at the model's own score, in its colour
        chance = lines[f"{model}: random chance"]
        assert chance.get_linestyle() == "--" and list(chance.get_ydata()) == [random, random]
        assert chance.get_color() == lines[model].get_color()
    assert "random chance" not in lines  # no one model's chance drawn for all


def test_a_metric_of_any_model_gets_its_figure(drawn, tmp_path) -> None:
    a = probe_result("retrieval", "retrieval", [2, 5], {"mAP_medium": [.1, .2]}, {"mAP_medium": 0.05})
    b = probe_result("retrieval", "retrieval", [2, 5], {"mAP_medium": [.3, .4], "mAP_hard": [.1, .3]}, None)
    paths = pf.models_probe_curves({"a": {"r": a}, "b": {"r": b}}, tmp_path)
    assert {Path(p).stem for p in paths} == {"compare_r_mAP_medium", "compare_r_mAP_hard"}
    hard = {line.get_label() for line in drawn["compare_r_mAP_hard"].axes[0].get_lines()}
    assert {"b"} <= hard and "a" not in hard  # a has no such scores: it is left out, not drawn empty
    assert list(next(line for line in drawn["compare_r_mAP_medium"].axes[0].get_lines()
                     if line.get_label() == "a").get_xdata()) == [2, 5]
