"""compare gives every model its own random baseline: random attention depends on the token grid; and the CKA
between models is about 0 for unrelated features."""

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


def _pooled_run(name: str, n: int, width: int, seed: int):
    """A model whose pooled features at its 3 blocks are Gaussian noise of its own (unrelated to any other)."""
    import torch

    from vitscope.comparison.curves import ModelRun
    from vitscope.comparison.pooled import PooledFeaturesResult

    g = torch.Generator().manual_seed(seed)
    tensors = {f"mean_{b}": torch.randn(n, width, generator=g) for b in range(3)}
    tensors.update(index=torch.arange(n), label=torch.full((n,), -1))
    meta = {"blocks": [0, 1, 2], "has_cls": False, "model": name}
    return ModelRun(name, None, {"pooled_features": PooledFeaturesResult("pooled_features", tensors, meta)}, name)


def test_cka_between_unrelated_models_is_about_zero_and_says_its_estimator() -> None:
    """The biased estimator scores two independent 128-wide representations of 40 images near 0.8; the unbiased
    one, compare's default, near 0. results.json's compare entry names the estimator."""
    from vitscope.comparison.curves import compare_runs
    from vitscope.errors import VitscopeValueError
    from vitscope.functional.cka import linear_cka

    runs = [_pooled_run("a", 40, 128, 0), _pooled_run("b", 40, 128, 1)]
    x, y = (r.results["pooled_features"].tensors["mean_2"].double() for r in runs)
    comp = compare_runs(runs)
    assert comp.cka_matrix[0, 1].item() == pytest.approx(linear_cka(x, y, unbiased=True), abs=1e-12)
    assert abs(comp.cka_matrix[0, 1].item()) < 0.1 and comp.cka_matrix[0, 0].item() == pytest.approx(1.0)
    assert comp.curves["cka_to_reference"]["b"].values[2] == pytest.approx(comp.cka_matrix[1, 0].item(), abs=1e-12)
    assert ComparisonResult(comp).to_json()["cka"]["estimator"] == "full_unbiased"
    biased = compare_runs(runs, cka_estimator="full")
    assert biased.cka_matrix[0, 1].item() == pytest.approx(linear_cka(x, y), abs=1e-12)
    assert biased.cka_matrix[0, 1].item() > 0.5 and biased.cka["estimator"] == "full"
    with pytest.raises(VitscopeValueError, match="cka_estimator"):
        compare_runs(runs, cka_estimator="minibatch")
