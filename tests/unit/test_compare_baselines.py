"""compare gives every model its own random baseline: random attention depends on the token grid."""

from __future__ import annotations

import math

import pytest

from vitscope.comparison.result import ComparisonResult
from vitscope.data.synthetic.write import synthesize
from vitscope.workflows.analyze import analyze
from vitscope.workflows.compare import comparison_run
from vitscope.workflows.options import CompareOptions, resolve

MODELS = ("tiny-vit-sup", "tiny-vit-metric-p16")  # 8 x 8 and 4 x 4 token grids at 64 px


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    base = tmp_path_factory.mktemp("baselines")
    coco = synthesize(base / "coco", "coco", n=6, size=64, seed=3)
    options = resolve(CompareOptions, {"models": ",".join(MODELS), "data": f"{coco}::coco",
                                       "out": str(base / "out"), "device": "cpu", "batch_size": 3})
    run = comparison_run(options, progress=False)
    return coco, run.results["compare"]


def test_each_model_has_the_random_baseline_of_its_own_grid(compared) -> None:
    coco, result = compared
    random = result.comparison.random
    for quantity, analysis, key in (("attention_distance", "attention_distance", "random_block_mean"),
                                    ("saliency_iou", "saliency_iou", "random_cls_best_iou")):
        assert set(random[quantity]) == set(MODELS), quantity
        for model in MODELS:  # the same value a model's own analyze gives
            alone = analyze(model, f"{coco}::coco", [analysis], batch_size=3, device="cpu", progress=False)
            assert math.isclose(random[quantity][model], float(alone[analysis].tensors[key].mean()), rel_tol=1e-9)
        first, second = (random[quantity][m] for m in MODELS)
        assert abs(first - second) > 0.01, quantity  # different grids, different chance levels


def test_best_block_table_and_figures_use_each_models_baseline(compared) -> None:
    _, result = compared
    comp = result.comparison
    for row in comp.best_blocks:
        assert row["random"] == comp.random[row["quantity"]][row["model"]]
    figure = next(f for f in result.figures() if f.stem == "compare_attention_distance")
    curves = figure.chart.panels[0].curves
    dashed = {c.name: c for c in curves if c.style == "dashed"}
    assert set(dashed) == set(MODELS)
    for model in MODELS:  # dashed in the model's colour, at its own level
        assert dashed[model].colour == model
        assert dashed[model].values == [comp.random["attention_distance"][model]] * 2
    summary = ComparisonResult(comp).to_json()
    assert summary["random"]["attention_distance"] == comp.random["attention_distance"]


def test_a_quantity_without_baselines_has_no_random_column() -> None:
    from vitscope.comparison.curves import Comparison, Curve
    from vitscope.comparison.outputs import _values_table

    comp = Comparison(curves={"cka_to_reference": {"a": Curve([0, 1], [0.0, 1.0], [0.5, 0.6])},
                              "attention_distance": {"a": Curve([0, 1], [0.0, 1.0], [0.4, 0.5]),
                                                     "b": Curve([0, 1], [0.0, 1.0], [0.3, 0.2])}},
                      random={"attention_distance": {"a": 0.59}})
    cka = _values_table("cka_to_reference", comp)
    assert cka.columns == ["model", "block 0", "block 1"] and cka.rows == [["a", "0.5", "0.6"]]
    dist = _values_table("attention_distance", comp)
    assert dist.columns[-1] == "random" and [r[-1] for r in dist.rows] == ["0.59", ""]
