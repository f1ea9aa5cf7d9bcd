"""``vitscope probe`` end to end on synthetic benchmarks (``vitscope synth``, 64 px) with the tiny zoo."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vitscope.cli.main import app
from vitscope.viz.labels import label

runner = CliRunner()


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("probe_cli")
    plan = {"revisitop": 12, "davis": 1, "spair": 4, "imagefolder": 30}
    for fmt, n in plan.items():
        res = runner.invoke(app, ["synth", "--out", str(root / fmt), "--format", fmt, "--n", str(n), "--size", "64",
                                  "--seed", "3", "--classes", "3"])
        assert res.exit_code == 0, res.output
    return {**{fmt: root / fmt for fmt in plan}, "cache": root / "cache"}


def probe(data: dict[str, Path], out: Path, fmt: str, *extra: str, model: str = "tiny-vit-metric"):
    return runner.invoke(app, ["probe", "--model", model, "--data", f"{data[fmt]}::{fmt}", "--out", str(out),
                               "--cache", str(data["cache"]), *extra])


def _scores(doc: dict, task: str, metric: str) -> list[float]:
    return doc["analyses"][task]["summary"][metric]


def _check_outputs(out: Path, doc: dict, tasks: set[str], blocks: list[int], pngs: bool = False) -> None:
    assert set(doc["analyses"]) == tasks and doc["models"][0]["name"] == "tiny-vit-metric"
    assert doc["vitscope_version"] and doc["config"]["task"] and doc["data"]["format"]
    with (out / "tables" / "best_blocks.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["task"] for r in rows} == tasks and len(rows) == len(doc["best_blocks"]["rows"])
    for task, entry in doc["analyses"].items():
        summary = entry["summary"]
        assert summary["blocks"] == blocks
        for metric in summary["metrics"]:
            values = [v for v in summary[metric] if v is not None]  # null: not a number (strict JSON)
            assert len(summary[metric]) == len(blocks)
            assert all(-1 <= v <= 1 for v in values), (task, metric, values)  # ARI may be negative
            assert f"random_{metric}" in summary
        charts = [json.loads((out / p).read_text())["panels"][0] for p in entry["files"]["figures"]
                  if p.endswith(".json")]  # one chart per metric: its curve, then random chance
        assert [c["y_label"] for c in charts] == [label(m) for m in summary["metrics"]]  # NMI, mAP medium
        for chart, metric in zip(charts, summary["metrics"]):
            random = summary[f"random_{metric}"]
            assert chart["curves"][0]["values"] == summary[metric]
            assert chart["curves"][1]["values"] == [random] * len(blocks)
        files = [p for p in entry["files"]["figures"] if p.endswith(".png")]  # only with --figure-files
        assert len(files) == (len(summary["metrics"]) if pngs else 0)
        assert all((out / p).stat().st_size > 0 for p in files)
    assert (out / "report.html").stat().st_size > 0


def test_retrieval(data, tmp_path: Path) -> None:
    res = probe(data, tmp_path, "revisitop", "--figure-files")
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "results.json").read_text())
    _check_outputs(tmp_path, doc, {"retrieval"}, list(range(6)), pngs=True)
    medium = _scores(doc, "retrieval", "mAP_medium")
    assert all(0 <= v <= 1 for v in medium)
    assert max(medium) > doc["analyses"]["retrieval"]["summary"]["random_mAP_medium"]
    assert "mAP_medium" in res.output


def test_davis_with_tiling_and_chosen_blocks(data, tmp_path: Path) -> None:
    plain = probe(data, tmp_path / "plain", "davis", "--blocks", "0,-1")
    tiled = probe(data, tmp_path / "tiled", "davis", "--blocks", "0,-1", "--tiling", "2")
    assert plain.exit_code == 0 and tiled.exit_code == 0, plain.output + tiled.output
    docs = {k: json.loads((tmp_path / k / "results.json").read_text()) for k in ("plain", "tiled")}
    for k, doc in docs.items():
        _check_outputs(tmp_path / k, doc, {"davis"}, [0, 5])
        s = doc["analyses"]["davis"]["summary"]
        for jf, j, f in zip(s["J&F"], s["J"], s["F"]):
            assert 0 <= j <= 1 and 0 <= f <= 1 and jf == pytest.approx((j + f) / 2)
        assert max(s["J&F"]) > s["random_J&F"]
    assert docs["plain"]["analyses"]["davis"]["summary"]["view"]["view"] == "frame"
    assert docs["tiled"]["analyses"]["davis"]["summary"]["view"]["view"] == "tiled"
    assert docs["tiled"]["config"]["tiling"] == 2


def test_keypoints(data, tmp_path: Path) -> None:
    res = probe(data, tmp_path, "spair", "--tiling", "2")
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "results.json").read_text())
    _check_outputs(tmp_path, doc, {"keypoints"}, list(range(6)))
    s = doc["analyses"]["keypoints"]["summary"]
    for a, b, c in zip(s["PCK@0.1"], s["PCK@0.05"], s["PCK@0.01"]):
        assert 1 >= a >= b >= c >= 0
    assert s["view"]["view"] == "tiled"


def test_labelled_images_give_knn_linear_and_clustering(data, tmp_path: Path) -> None:
    res = probe(data, tmp_path, "imagefolder", "--blocks", "-1", "--test-fraction", "0.3", "--tiling", "2")
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "results.json").read_text())
    tasks = {f"{kind}_{t}" for kind in ("knn", "linear", "clustering") for t in ("cls", "spatial_mean")}
    tasks |= {"linear_cls_bn", "linear_spatial_mean_bn"}
    _check_outputs(tmp_path, doc, tasks, [5])
    charts = [json.loads((tmp_path / p).read_text())["panels"][0]
              for p in doc["analyses"]["clustering_cls"]["files"]["figures"]]
    assert [c["y_label"] for c in charts] == ["purity", "NMI", "ARI"]  # as people write them
    assert charts[1]["title"] == "Clustering: NMI per block"
    knn = doc["analyses"]["knn_cls"]["summary"]
    assert knn["num_train"] + knn["num_test"] == 30 and knn["num_test"] > 0
    assert all(0 <= v <= 1 for v in knn["accuracy"])
    # tiling densifies the spatial-mean features; CLS features keep the model's own preprocessing
    assert doc["analyses"]["knn_spatial_mean"]["summary"]["view"] == "tiled" and knn["view"] == "standard"


def test_errors_are_one_line(data, tmp_path: Path) -> None:
    cnn = probe(data, tmp_path / "cnn", "davis", model="tiny-resnet-metric")
    assert cnn.exit_code == 1 and "is a CNN" in cnn.output and "Traceback" not in cnn.output
    tiled_retrieval = probe(data, tmp_path / "r", "revisitop", "--tiling", "2")
    assert tiled_retrieval.exit_code == 1 and "retrieval ranks CLS features" in tiled_retrieval.output
    assert probe(data, tmp_path / "b", "revisitop", "--blocks", "6").exit_code == 2
    assert probe(data, tmp_path / "t", "revisitop", "--tiling", "0.5").exit_code == 2
    assert not (tmp_path / "cnn" / "results.json").exists()


def test_a_killed_probe_continues_where_it_stopped(data: dict[str, Path], tmp_path: Path, monkeypatch) -> None:
    """The extraction keeps its rows on disk as it goes: a probe stopped mid-pass resumes it, and the numbers are
    those of a probe that never stopped."""
    cache = tmp_path / "cache"
    args = ["probe", "--model", "tiny-vit", "--data", f"{data['imagefolder']}::imagefolder", "-b", "4",
            "--cache", str(cache), "--blocks", "-1"]
    monkeypatch.setenv("VITSCOPE_STOP_AFTER_BATCHES", "2")
    stopped = runner.invoke(app, [*args, "--out", str(tmp_path / "a")])
    assert stopped.exit_code == 130 and "state saved" in stopped.output, stopped.output
    monkeypatch.delenv("VITSCOPE_STOP_AFTER_BATCHES")
    resumed = runner.invoke(app, [*args, "--out", str(tmp_path / "a")])
    assert resumed.exit_code == 0 and "resuming from saved state: 8 images already done" in resumed.output, \
        resumed.output
    fresh = runner.invoke(app, [*args[:-4], "--cache", str(tmp_path / "fresh"), "--blocks", "-1", "--out",
                                str(tmp_path / "b")])
    assert fresh.exit_code == 0, fresh.output
    a, b = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("a", "b"))
    for task in ("knn_cls", "linear_cls"):
        assert a["analyses"][task]["summary"] == b["analyses"][task]["summary"], task
    # results.json says what the cache's passes did, as analyze's does: 30 images decode in a thread
    assert (a["run"]["resumed_images"], a["run"]["workers"], b["run"]["resumed_images"], b["run"]["workers"]) == \
        (8, 0, 0, 0)
    assert a["config"]["device"] == "auto" and a["run"]["device"]["device"] in ("cpu", "cuda:0")
    # and what they cost: the resumed pass fed 30 - 8 images, the fresh one all 30
    for doc, fed in ((a, 22), (b, 30)):
        assert doc["run"]["images_per_second"] == pytest.approx(fed / doc["run"]["pass_seconds"], rel=0.01)


def _doc(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


def test_probe_reads_a_config_file_and_limit_keeps_the_first_items(data: dict[str, Path], tmp_path: Path) -> None:
    """probe takes its options from --config as analyze does (the command line wins), and --limit keeps the first
    images (a limited set is its own feature-cache entry)."""
    config = tmp_path / "probe.yaml"
    config.write_text(f"model: tiny-vit\ndata: {data['imagefolder']}::imagefolder\nout: {tmp_path / 'limited'}\n"
                      f"cache: {tmp_path / 'cache'}\nblocks: [-1]\nlimit: 25\nbatch_size: 4\nseed: 3\n")
    limited = runner.invoke(app, ["probe", "--config", str(config), "-b", "5"])
    assert limited.exit_code == 0, limited.output
    doc = _doc(tmp_path / "limited")
    assert doc["config"]["batch_size"] == 5 and doc["config"]["seed"] == 3 and doc["config"]["limit"] == 25
    assert doc["config"]["blocks"] == [-1] and doc["config"]["config_file"] == str(config)
    knn = doc["analyses"]["knn_cls"]["summary"]
    assert doc["num_images"] == doc["data"]["num_files"] == knn["num_train"] + knn["num_test"] == 25
    whole = runner.invoke(app, ["probe", "--config", str(config), "--out", str(tmp_path / "whole"), "--limit", "30"])
    assert whole.exit_code == 0, whole.output
    doc = _doc(tmp_path / "whole")  # the same cache: the 25 images' entry is not taken for the 30
    knn = doc["analyses"]["knn_cls"]["summary"]
    assert doc["num_images"] == knn["num_train"] + knn["num_test"] == 30 and doc["config"]["batch_size"] == 4
    refused = runner.invoke(app, ["probe", "--model", "tiny-vit", "--data", f"{data['revisitop']}::revisitop",
                                  "--out", str(tmp_path / "r2"), "--limit", "3"])
    assert refused.exit_code == 2 and "--limit does not apply to revisitop" in refused.output  # bad usage


def test_probe_strict_stops_at_an_unreadable_image(data: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "images"
    shutil.copytree(data["imagefolder"], root)
    broken = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix != ".json")[3]
    broken.write_bytes(b"not an image")
    args = ["probe", "--model", "tiny-vit", "--data", f"{root}::imagefolder", "--cache", str(tmp_path / "cache"),
            "--blocks", "-1"]
    strict = runner.invoke(app, [*args, "--out", str(tmp_path / "strict"), "--strict"])
    assert strict.exit_code == 1 and broken.name in strict.output and "Traceback" not in strict.output, strict.output
    assert not (tmp_path / "strict" / "results.json").exists()
    lenient = runner.invoke(app, [*args, "--out", str(tmp_path / "lenient"), "--no-strict"])
    assert lenient.exit_code == 0 and broken.name in lenient.output, lenient.output  # a warning, and on it goes
    doc = _doc(tmp_path / "lenient")
    knn = doc["analyses"]["knn_cls"]["summary"]
    assert knn["num_train"] + knn["num_test"] == 29
    assert doc["config"]["batch_size"] == 16  # -b defaults to 16, as on analyze and compare


def test_no_resume_starts_an_interrupted_extraction_over(data: dict[str, Path], tmp_path: Path, monkeypatch) -> None:
    args = ["probe", "--model", "tiny-vit", "--data", f"{data['imagefolder']}::imagefolder", "-b", "4",
            "--cache", str(tmp_path / "cache"), "--blocks", "-1", "--out", str(tmp_path / "a")]
    monkeypatch.setenv("VITSCOPE_STOP_AFTER_BATCHES", "2")
    stopped = runner.invoke(app, [*args, "--resume"])
    assert stopped.exit_code == 130 and "state saved" in stopped.output, stopped.output
    monkeypatch.delenv("VITSCOPE_STOP_AFTER_BATCHES")
    fresh = runner.invoke(app, [*args, "--no-resume"])
    assert fresh.exit_code == 0 and "resuming" not in fresh.output, fresh.output
    knn = _doc(tmp_path / "a")["analyses"]["knn_cls"]["summary"]
    assert knn["num_train"] + knn["num_test"] == 30
