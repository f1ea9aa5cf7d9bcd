"""End-to-end: `vitscope experiment guided-mae` (a few steps) and `vitscope experiment robustness` (ViT and CNN).

guided-mae runs in-process (CliRunner) to keep the suite fast; robustness runs as a user runs it.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("cv2")

from typer.testing import CliRunner

from helpers.cli import cli
from vitscope.cli.main import app
from vitscope.data.synthetic.write import synthesize


def test_guided_mae_few_steps(tmp_path):
    out = tmp_path / "gm"
    proc = CliRunner().invoke(app, ["experiment", "guided-mae", "--out", str(out), "--steps", "4", "--batch-size",
                                    "8", "--train-images", "16", "--eval-points", "2", "--bank-images", "16",
                                    "--test-images", "10", "--every-epochs", "1", "--depth", "1", "--embed-dim", "16"])
    assert proc.exit_code == 0, proc.stderr
    doc = json.loads((out / "results.json").read_text())
    entry = doc["analyses"]["guided_mae"]["summary"]
    assert entry["steps"] == [0, 2, 4] and entry["epochs"] == [0.0, 1.0, 2.0] and entry["rho"] == [0.0, 0.0, 0.25]
    assert set(entry["accuracy"]) == {"random", "guided"}
    assert entry["accuracy"]["random"][0] == entry["accuracy"]["guided"][0]  # the twins start identical
    assert all(0 <= a <= 1 for curve in entry["accuracy"].values() for a in curve)
    assert entry["convergence"]["faster"] in {"random", "guided", "tie", "neither"}
    chart = json.loads((out / "charts" / "guided_mae.json").read_text())
    assert chart["panels"][0]["curves"][1]["values"] == pytest.approx(entry["accuracy"]["guided"])
    # the curriculum as a staircase (2 steps an epoch, a level an epoch): 0 up to epoch 1, then 0.25
    assert entry["curriculum"] == {"epochs": [0.0, 1.0, 1.0, 2.0], "rho": [0.0, 0.0, 0.25, 0.25]}
    rho = chart["panels"][1]["curves"][0]
    assert rho["x"] == entry["curriculum"]["epochs"] and rho["values"] == entry["curriculum"]["rho"]
    assert not (out / "figures" / "guided_mae.png").exists()  # drawn only with --figure-files
    assert (out / "tables" / "guided_mae.csv").read_text().startswith("step,epoch,rho,random,guided")
    assert 'id="s-guided-mae"' in (out / "report.html").read_text()


@pytest.mark.parametrize(("option", "value", "message"), [("--mask-ratio", "0", "mask_ratio must be in (0, 1)"),
                                                          ("--embed-dim", "10", "embed_dim (10) must be a multiple")])
def test_guided_mae_settings_it_cannot_train_are_bad_usage(tmp_path, option, value, message):
    proc = CliRunner().invoke(app, ["experiment", "guided-mae", "--out", str(tmp_path / "gm"), option, value])
    assert proc.exit_code == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "gm").exists()


def test_robustness_vit_beside_cnn(tmp_path):
    coco = synthesize(tmp_path / "coco", "coco", n=3, size=64, seed=5)
    cnn = "tiny-resnet-sup"  # the zoo's CNN classifier; the numbers are checked in tests/validation
    out = tmp_path / "rob"
    proc = cli("experiment", "robustness", "--models", f"tiny-vit-sup,{cnn}", "--data", f"{coco}::coco",
                    "--out", str(out), "--device", "cpu", "--figure-files")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "results.json").read_text())
    fg, freq = doc["analyses"]["foreground_masking"], doc["analyses"]["frequency_filtering"]
    assert list(fg["summary"]) == list(freq["summary"]) == ["tiny-vit-sup", cnn]  # ViT beside CNN
    for model, res in fg["summary"].items():
        assert res["images_used"] == 3 and len(res["accuracy"]) == 3 and res["fill"] == "zero"
        assert len(freq["summary"][model]["accuracy"]) == 2
    assert "figures/foreground_masking.png" in fg["files"]["figures"]
    assert "figures/frequency_filtering.png" in freq["files"]["figures"]
    bars = json.loads((out / "charts" / "foreground_masking.json").read_text())["panels"][0]["curves"]
    assert [b["colour"] for b in bars] == ["tiny-vit-sup", "tiny-vit-sup", cnn, cnn, ""]  # a colour per model
    assert 'id="s-frequency-filtering"' in (out / "report.html").read_text()
    bad = CliRunner().invoke(app, ["experiment", "robustness", "--models", "tiny-vit-mae", "--data", f"{coco}::coco",
                                   "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 1 and "classifier head" in bad.stderr
    bad = CliRunner().invoke(app, ["experiment", "robustness", "--models", "tiny-vit-sup", "--data", f"{coco}::coco",
                                   "--out", str(tmp_path / "bad"), "--fill", "noise"])
    assert bad.exit_code == 2 and "--fill must be one of zero, mean, blur, got 'noise'" in bad.stderr


def test_robustness_runs_the_foreground_test_on_boxes_alone(tmp_path):
    """ImageNet's boxes (no masks) are the paper's protocol: region "box" scores them as `analyze` does; region
    "mask" lists the test as not run."""
    import vitscope
    from vitscope.analyses.masking.foreground import ForegroundMasking
    from vitscope.experiments.robustness import run_robustness

    boxes = synthesize(tmp_path / "inb", "imagenet-boxes", n=6, size=64, seed=3)
    data = f"{boxes}::imagenet-boxes"
    doc = run_robustness(["tiny-vit-sup"], data, tmp_path / "rob", batch_size=4, device="cpu", fill="mean",
                         progress=False)
    summary = doc["analyses"]["foreground_masking"]["summary"]["tiny-vit-sup"]
    alone = vitscope.run(vitscope.load_model("tiny-vit-sup"), data, [ForegroundMasking(region="box", fill="mean")],
                         batch_size=4, device="cpu", progress=False, workers=0)["foreground_masking"]
    assert summary["images_used"] == 6 and summary["fill"] == "mean" == doc["config"]["fill"]
    assert summary["accuracy"] == alone.tensors["accuracy"].tolist()
    masks = run_robustness(["tiny-vit-sup"], data, tmp_path / "robm", batch_size=4, device="cpu", region="mask",
                           progress=False)
    assert "foreground_masking" not in masks["analyses"]
    assert [s["analysis"] for s in masks["skipped_analyses"]] == ["foreground_masking"]
    for xml in (boxes / "boxes").rglob("*.xml"):  # no image has a box: the test is listed as not run, the rest runs
        xml.unlink()
    bare = run_robustness(["tiny-vit-sup"], data, tmp_path / "rob0", batch_size=4, device="cpu", progress=False)
    assert "foreground_masking" not in bare["analyses"] and "frequency_filtering" in bare["analyses"]
    assert [s["reason"] for s in bare["skipped_analyses"]] == [
        "no image has a foreground inside the model's input (box regions after the resize and crop)"]
