"""End-to-end: `vitscope analyze --analyses attention,interrelation,masking` on synthetic COCO, as a user runs it."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("cv2")

from typer.testing import CliRunner

from helpers.cli import cli
from vitscope.cli.main import app
from vitscope.data.synthetic.write import synthesize


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return synthesize(tmp_path_factory.mktemp("coco"), "coco", n=6, size=64, seed=4)


def test_interrelation_and_masking_in_one_pass(coco, tmp_path):
    out = tmp_path / "out"
    proc = cli("analyze", "--model", "tiny-vit-sup", "--data", f"{coco}::coco", "--out", str(out),
                    "--analyses", "attention_focus,interrelation,masking", "--batch-size", "3", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "results.json").read_text())
    assert set(doc["analyses"]) == {"attention_focus", "interrelation", "interrelation_masking",
                                    "foreground_masking", "frequency_filtering"}
    assert doc["hooks"] == [f"blocks.{i}.attn.pattern" for i in range(6)]  # one recording feeds all
    inter = doc["analyses"]["interrelation"]["summary"]
    kk, nk = np.array(inter["KK"], dtype=float), np.array(inter["NK"], dtype=float)
    assert kk.shape == (6, 4) and np.isfinite(kk).all() and ((kk >= 0) & (kk <= 1)).all()
    np.testing.assert_allclose(np.array(inter["KN"], dtype=float), 1 - kk)
    np.testing.assert_allclose(np.array(inter["NN"], dtype=float), 1 - nk)
    np.testing.assert_allclose(inter["focus"], doc["analyses"]["attention_focus"]["summary"]["focus"])
    stages = inter["stages"]
    assert sorted(stages["retrieval"] + stages["capture"] + stages["coach"]) == list(range(6))
    # this model's KK leaves the random baseline's band, so the stages stand, and the run says why
    assert inter["has_stages"] is True and inter["stage_structure"].startswith("stages read from KK")
    assert len(inter["random_KK_blocks"]) == 6 and len(set(inter["random_KK_blocks"])) == 1
    masking = doc["analyses"]["interrelation_masking"]["summary"]
    acc = np.array(masking["accuracy"])
    assert acc.shape == (3, 10) and masking["orders"] == ["top", "bottom", "random"]
    assert 0 < masking["full_accuracy"] <= 1 and set(masking["flagged_on_background"]) == {"top", "bottom"}
    fg = doc["analyses"]["foreground_masking"]["summary"]
    assert np.array(fg["normalised_accuracy"]).shape == (3, 2) and fg["normalised_accuracy"][0] == [1.0, 1.0]
    freq = doc["analyses"]["frequency_filtering"]["summary"]
    assert np.array(freq["accuracy"]).shape == (2, 7)
    figures = {rel.rsplit("/", 1)[-1] for entry in doc["analyses"].values() for rel in entry["files"]["figures"]}
    assert "interrelation_keypoints.png" in figures and (out / "figures" / "interrelation_keypoints.png").is_file()
    charts = {stem: json.loads((out / "charts" / f"{stem}.json").read_text())["panels"][0] for stem in
              ("interrelation_kk_nk", "interrelation_focus", "interrelation_stages", "interrelation_masking",
               "foreground_masking", "frequency_filtering")}  # curves the browser draws from their numbers
    assert all(len(charts[s]["x_ticks"]) == 6 for s in ("interrelation_kk_nk", "interrelation_focus"))
    baseline = next(c for c in charts["interrelation_kk_nk"]["curves"] if c["name"] == "random attention KK (baseline)")
    assert baseline["baseline"] and baseline["values"] == pytest.approx(inter["random_KK_blocks"])
    stages = charts["interrelation_stages"]
    assert {b["name"] for b in stages["bands"]} <= {"retrieval", "capture", "coach"} and stages["bands"]
    assert stages["curves"][0]["values"] == pytest.approx(kk.mean(axis=1).tolist())
    top = charts["interrelation_masking"]["curves"][0]
    assert top["name"] == "top first" and top["values"] == pytest.approx(acc[0].tolist())
    assert top["x"] == pytest.approx([100 * r for r in masking["ratios"]])
    bars = charts["foreground_masking"]["curves"]
    assert [b["style"] for b in bars] == ["bars", "hatched_bars", "dashed"]
    assert bars[0]["values"] == pytest.approx(fg["normalised_accuracy"][1])
    assert charts["frequency_filtering"]["curves"][1]["values"] == pytest.approx(freq["accuracy"][1])
    report = (out / "report.html").read_text()
    for section in ("interrelation", "interrelation-masking", "foreground-masking", "frequency-filtering"):
        assert f'id="s-{section}"' in report
    assert report.count("<img") >= 1 and report.count("data-chart data-stem=") >= 9  # pictures and charts


@pytest.mark.parametrize(("model", "analyses", "message"), [
    ("tiny-vit-mae", "masking", "classifier head"),  # accuracy needs a classifier
    ("tiny-vit-sup", "interrelation_mask", "Did you mean 'interrelation_masking'"),  # typos get a suggestion
    ("tiny-vit-sup", "foreground", "Did you mean 'foreground_masking'"),  # among the model-bound analyses
    ("tiny-vit-sup", "maskin", "Groups: artifacts, attention, interventions, masking,"),  # and the groups
])
def test_masking_explains_what_cannot_run(coco, tmp_path, model, analyses, message):
    result = CliRunner().invoke(app, ["analyze", "--model", model, "--data", f"{coco}::coco", "--out",
                                      str(tmp_path / "o"), "--analyses", analyses, "--device", "cpu"])
    assert result.exit_code == (1 if message == "classifier head" else 2)  # a name that does not exist: bad usage
    assert message in result.stderr and "Traceback" not in result.stderr
