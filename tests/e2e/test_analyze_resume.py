"""End-to-end: `vitscope analyze --config`, interrupted and re-run, equals an uninterrupted run."""

from __future__ import annotations

import json

import pytest

from golden.compare import differences
from helpers.cli import ENV, cli, vitscope
from vitscope.data.synthetic.write import synthesize

ANALYSES = "attention_distance,cka,knn_probe"


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return synthesize(tmp_path_factory.mktemp("coco"), "coco", n=20, size=64, seed=5)


def test_interrupted_run_resumes_to_the_same_numbers(coco, tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"model: tiny-vit-sup\ndata: '{coco}::coco'\nanalyses: {ANALYSES}\nbatch_size: 4\n"
                   "limit: 100\ndevice: cpu\n")
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    proc = cli("analyze", "--config", str(cfg), "--out", str(full))
    assert proc.returncode == 0, proc.stderr

    stop = {**ENV, "VITSCOPE_STOP_AFTER_BATCHES": "2"}
    proc = vitscope("analyze", "--config", str(cfg), "--out", str(resumed), env=stop)
    assert proc.returncode == 130 and "state saved" in proc.stderr, proc.stderr
    assert (resumed / ".vitscope-state" / "tiny-vit-sup.pt").exists() and not (resumed / "results.json").exists()

    proc = cli("analyze", "--config", str(cfg), "--out", str(resumed))  # the interrupted one ran as a user runs it
    assert proc.returncode == 0, proc.stderr
    assert "resuming from saved state: 8 images already done" in proc.stderr
    a, b = (json.loads((d / "results.json").read_text()) for d in (full, resumed))
    assert b["run"]["resumed_images"] == 8 and a["run"]["resumed_images"] == 0
    assert "earlier_parts" not in a["run"] and len(b["run"]["earlier_parts"]) == 1
    assert a["analyses"].keys() == set(ANALYSES.split(","))
    for name in a["analyses"]:
        assert a["analyses"][name]["summary"] == b["analyses"][name]["summary"], name
    assert not (resumed / ".vitscope-state").exists()
    # the resolved configuration, version, model id and data fingerprint are recorded
    assert b["config"]["config_file"] == str(cfg) and b["config"]["batch_size"] == 4 and b["config"]["limit"] == 100
    assert b["vitscope_version"] and b["models"][0]["id"] == "tiny-vit-sup" and b["models"][0]["weights_sha256"]
    assert b["data"]["fingerprint"] == a["data"]["fingerprint"]
    assert (resumed / "report.html").stat().st_size > 0


def test_an_interrupted_compare_records_the_images_it_resumed(coco, tmp_path):
    """compare resumes each model's pass from its own state; results.json adds up what the states held."""
    base = ("compare", "--models", "sup=tiny-vit-sup,met=tiny-vit-metric", "-d", f"{coco}::coco", "-o",
            str(tmp_path / "out"), "--device", "cpu", "--checkpoint-seconds", "0")
    proc = vitscope(*base, "-b", "4", env={**ENV, "VITSCOPE_STOP_AFTER_BATCHES": "2"})  # stops in the first model
    assert proc.returncode == 130 and "state saved" in proc.stderr, proc.stderr
    proc = cli(*base, "-b", "6")
    assert proc.returncode == 0, proc.stderr
    assert "resuming from saved state: 8 images already done" in proc.stderr
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["run"]["resumed_images"] == 8 and doc["images_per_model"] == {"sup": 20, "met": 20}
    assert doc["run"]["earlier_parts"] == [{"images": 8, "batch_size": 4, "workers": 0}]
    assert doc["config"]["device"] == "cpu" and doc["run"]["device"] == {"device": "cpu"}


def test_state_from_other_settings_is_not_merged_but_another_batch_size_resumes(coco, tmp_path):
    out = tmp_path / "o"
    base = ["analyze", "-m", "tiny-vit", "-d", f"{coco}::coco", "-a", "attention_distance,cka", "-o", str(out),
            "--param", "cka.batch=4", "-b", "4"]
    proc = cli(*base, env={"VITSCOPE_STOP_AFTER_BATCHES": "1"})
    assert proc.returncode == 130, proc.stderr
    proc = cli(*base[:-2], "-b", "4", "--limit", "10")  # another limit: the saved state does not apply
    assert proc.returncode == 0, proc.stderr
    assert "ignoring saved state" in proc.stderr and "limit" in proc.stderr
    assert json.loads((out / "results.json").read_text())["run"]["resumed_images"] == 0
    proc = cli(*base[:-2], "-b", "3", "--limit", "10", env={"VITSCOPE_STOP_AFTER_BATCHES": "1"})
    assert proc.returncode == 130, proc.stderr
    proc = cli(*base[:-2], "-b", "2", "--limit", "10")  # another batch size: no number depends on it
    assert proc.returncode == 0 and "resuming from saved state" in proc.stderr, proc.stderr
    resumed = json.loads((out / "results.json").read_text())
    assert resumed["run"]["resumed_images"] == 3
    # the saved images were read three at a time: the run says so beside its own batch size
    assert resumed["run"]["earlier_parts"] == [{"images": 3, "batch_size": 3, "workers": 0}]
    assert resumed["config"]["batch_size"] == 2
    fresh = tmp_path / "fresh"
    fresh_args = [str(fresh) if a == str(out) else a for a in base[:-2]]
    assert cli(*fresh_args, "-b", "10", "--limit", "10").returncode == 0
    want = json.loads((fresh / "results.json").read_text())
    for name in ("attention_distance", "cka"):  # the forward's float32 rounding differs between batch sizes
        found = differences(want["analyses"][name]["summary"], resumed["analyses"][name]["summary"], rtol=1e-6,
                            atol=1e-9)
        assert not found, (name, found)


def test_config_and_compare_errors_are_one_line(coco, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: tiny-vit\nbatchsize: 3\n")
    cases = [  # bad options are bad usage (exit status 2); failures exit with 1
        (["analyze", "--config", str(bad), "-d", "x", "-o", str(tmp_path)], 2, "did you mean 'batch_size'"),
        (["analyze", "-d", f"{coco}::coco", "-o", str(tmp_path)], 2, "missing --model"),
        (["compare", "--models", "tiny-vit,tiny-vit", "-d", f"{coco}::coco", "-o", str(tmp_path)], 1, "listed twice"),
        (["compare", "--models", "tiny-vit", "-d", f"{coco}::coco", "-o", str(tmp_path)], 2, "at least two models"),
    ]
    for args, status, needle in cases:
        proc = cli(*args)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert proc.returncode == status and len(lines) == 1 and lines[0].startswith("error: "), (args, proc.stderr)
        assert needle in lines[0], lines[0]
