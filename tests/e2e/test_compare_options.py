"""``vitscope compare`` takes what analyze takes (--analyses, --param, also in --config) and names its models
(``--models a=MODEL,b=MODEL``): the names label results.json, the tables, the charts and the report."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from helpers.cli import cli
from vitscope.data.synthetic.write import synthesize

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def coco(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"{synthesize(tmp_path_factory.mktemp('compare_options') / 'coco', 'coco', n=6, size=64, seed=3)}::coco"


def test_named_models_with_chosen_analyses_and_parameters(coco: str, tmp_path: Path) -> None:
    from vitscope.workflows.analyze import analyze

    out = tmp_path / "cmp"
    res = cli("compare", "--models", "a=tiny-vit,b=tiny-vit-p16", "--data", coco, "--out", str(out), "-b", "3",
              "--device", "cpu", "--analyses", "attention_distance,attention_stats",
              "--param", "attention_distance.seed=5")
    assert res.returncode == 0, res.stderr
    doc = json.loads((out / "results.json").read_text())
    assert [(m["display_name"], m["id"]) for m in doc["models"]] == [("a", "tiny-vit"), ("b", "tiny-vit-p16")]
    assert doc["images_per_model"] == {"a": 6, "b": 6}
    for m in doc["models"]:  # what each model ran: the chosen analyses, and no saliency although there are masks
        assert m["analyses"] == ["pooled_features", "attention_distance", "attention_stats"]
    assert set(doc["analyses"]) == {"compare", "attention_stats@a", "attention_stats@b"}
    summary = doc["analyses"]["compare"]["summary"]
    assert set(summary["curves"]) == {"attention_distance", "clustering_purity", "knn_accuracy", "cka_to_reference"}
    assert all(set(per_model) == {"a", "b"} for per_model in summary["curves"].values())
    assert summary["cka_models"] == ["a", "b"] and summary["cka_reference"] == "a"
    assert {row["model"] for row in summary["best_blocks"]} == {"a", "b"}
    assert doc["config"]["analyses"] == ["attention_distance", "attention_stats"]
    assert doc["config"]["params"] == {"attention_distance": {"seed": 5}}  # as the analysis took it
    for name, model in (("a", "tiny-vit"), ("b", "tiny-vit-p16")):  # the parameter took effect: seed 5's baseline
        seeded, default = (analyze(model, coco, ["attention_distance"], params={"attention_distance": {"seed": s}},
                                   batch_size=3, device="cpu", progress=False)["attention_distance"]
                           for s in (5, 0))
        assert math.isclose(summary["random"]["attention_distance"][name],
                            float(seeded.tensors["random_block_mean"].mean()), rel_tol=1e-9)
        assert not math.isclose(summary["random"]["attention_distance"][name],
                                float(default.tensors["random_block_mean"].mean()), rel_tol=1e-9)
    with (out / "tables" / "compare_curves.csv").open() as f:
        assert {row["model"] for row in csv.DictReader(f)} == {"a", "b"}
    chart = json.loads((out / "charts" / "compare_attention_distance.json").read_text())
    assert {c["name"] for c in chart["panels"][0]["curves"]} == {"a", "b"}
    report = (out / "report.html").read_text()
    assert "vitscope compare: a, b" in report and "Attention stats (a)" in report and "Attention stats (b)" in report
    assert "a: tiny-vit (" in report  # the summary says which model each name stands for


def test_a_cnn_beside_chosen_attention_analyses_is_noted_not_refused(coco: str, tmp_path: Path) -> None:
    res = cli("compare", "--models", "vit=tiny-vit,cnn=tiny-resnet", "--data", coco, "--out", str(tmp_path), "-b",
              "3", "--device", "cpu", "--limit", "3", "-a", "attention_stats")
    assert res.returncode == 0, res.stderr
    doc = json.loads((tmp_path / "results.json").read_text())
    assert set(doc["analyses"]) == {"compare", "attention_stats@vit"}
    assert [m["analyses"] for m in doc["models"]] == [["pooled_features", "attention_stats"], ["pooled_features"]]
    notes = doc["analyses"]["compare"]["summary"]["notes"]
    assert any(n.startswith("not run on cnn: ") and "attention_stats" in n for n in notes), notes


@pytest.mark.parametrize("models, needle", [
    ("a=tiny-vit,a=tiny-vit-p16", "two models are named 'a'"),
    ("tiny-vit,tiny-vit", "listed twice"),
    ("a=tiny-vit,b=", "names no model after '='"),
])
def test_names_must_be_unique(coco: str, tmp_path: Path, models: str, needle: str) -> None:
    res = cli("compare", "--models", models, "--data", coco, "--out", str(tmp_path))
    assert res.returncode == 1 and needle in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "results.json").exists()


def test_an_unknown_analysis_fails_before_any_model_loads(coco: str, tmp_path: Path) -> None:
    res = cli("compare", "--models", "a=no-such-model,b=tiny-vit", "--data", coco, "--out", str(tmp_path),
              "--analyses", "attention_stat")
    assert res.returncode == 2 and "unknown analysis 'attention_stat'" in res.stderr, res.stderr


def test_compare_models_from_python_takes_a_mapping_of_names(coco: str, tmp_path: Path) -> None:
    import vitscope

    result = vitscope.compare_models({"first model": "tiny-vit", "p16": "tiny-vit-p16"}, coco, tmp_path, limit=4,
                                     batch_size=4, device="cpu", analyses=["attention_distance"], progress=False)
    assert set(result.comparison.curves["attention_distance"]) == {"first model", "p16"}
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["config"]["models"] == {"first model": "tiny-vit", "p16": "tiny-vit-p16"}


def test_a_model_named_model_writes_its_cka_matrix(coco: str, tmp_path: Path) -> None:
    """The matrix's label column was called 'model' too: the writer stopped after every pass had run."""
    out = tmp_path / "cmp"
    res = cli("compare", "--models", "model=tiny-vit,b=tiny-vit-sup", "--data", coco, "--out", str(out), "-b", "6",
              "--device", "cpu", "--analyses", "attention_stats")
    assert res.returncode == 0, res.stderr
    import pandas as pd

    matrix = pd.read_csv(out / "tables" / "compare_cka_matrix.csv")
    assert list(matrix.columns) == ["model", "model.1", "b"] and matrix.iloc[:, 0].tolist() == ["model", "b"]


@pytest.mark.parametrize(("models", "extra", "needle", "status"), [
    ("a=tiny-vit-sup,b=no-such-model", [], "no-such-model", 1),
    ("a=tiny-vit,b=tiny-vit-p16", ["--image-size", "40"], "not a multiple of tiny-vit-p16's patch size", 2)])
def test_a_model_listed_later_is_refused_before_any_pass(coco: str, tmp_path: Path, models, extra, needle,
                                                         status) -> None:
    """The second model's name or size was checked only once the first model's whole pass had run."""
    res = cli("compare", "--models", models, "--data", coco, "--out", str(tmp_path / "o"), "-a", "attention_stats",
              *extra)
    assert res.returncode == status and needle in res.stderr, res.stderr
    assert not (tmp_path / "o").exists()


def test_too_few_images_for_cka_between_models_say_why_it_is_blank(coco: str, tmp_path: Path) -> None:
    import vitscope

    result = vitscope.compare_models({"a": "tiny-vit", "b": "tiny-vit-p16"}, coco, tmp_path, limit=3, batch_size=4,
                                     device="cpu", progress=False)
    assert all(math.isnan(float(v)) for v in result.comparison.cka_matrix.flatten())
    note = "CKA between models is blank: the models share 3 image(s) and the full_unbiased estimator needs at least 4"
    assert note in result.comparison.notes and note in (tmp_path / "report.html").read_text()
    assert note in json.loads((tmp_path / "results.json").read_text())["analyses"]["compare"]["summary"]["notes"]
