"""``vitscope explanations`` on a small synthetic world: every score beside its control, the background shortcut
from the world's own background types, and the outputs of every command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.cli import cli
from vitscope.data.synthetic.write import synthesize


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> str:
    # backgrounds follow the class half of the time: both kinds of scene for the shortcut score
    return f"{synthesize(tmp_path_factory.mktemp('w') / 'world', 'coco', n=8, size=64, seed=5, spurious=0.5)}::coco"


def test_methods_are_scored_beside_their_controls(world: str, tmp_path: Path) -> None:
    run = cli("explanations", "--models", "tiny-vit-sup-spurious,tiny-vit-sup,tiny-resnet-sup", "-d", world, "-o",
              str(tmp_path / "out"), "--methods", "rollout,gradcam", "--limit", "4", "--steps", "2",
              env={"VITSCOPE_PROGRESS_SECONDS": "0"})
    assert run.returncode == 0, run.stdout + run.stderr
    # progress within each model (it was one line per method): maps, two fills' curves and the sanity check
    assert "vitscope tiny-vit-sup explanations: 4/4 stages (100%)" in run.stderr, run.stderr
    assert run.stdout.strip().splitlines()[-1] == f"report: {tmp_path / 'out' / 'report.html'}"
    assert (tmp_path / "out" / "report.html").is_file()
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    summary = doc["analyses"]["explanations"]["summary"]
    assert doc["num_images"] == summary["images"] == 4  # the images scored
    rows = summary["rows"]
    vit = [r for r in rows if r["model"] == "tiny-vit-sup-spurious"]
    cnn = "reads attention or tokens; the model is a CNN"
    assert {r["method"] for r in vit} == {"rollout"} and summary["not_run"] == {
        "gradcam@tiny-vit-sup-spurious": "is for CNNs", "gradcam@tiny-vit-sup": "is for CNNs",
        "rollout@tiny-resnet-sup": cnn}
    assert {s["analysis"]: s["reason"] for s in doc["skipped_analyses"]} == summary["not_run"]
    assert "gradcam@tiny-vit-sup skipped: is for CNNs" in run.stdout  # what was left out, and why, is printed
    assert f"rollout@tiny-resnet-sup skipped: {cnn}" in run.stdout
    families = {(r["family"], r["metric"]) for r in vit}
    assert {("localisation", "pointing_game"), ("faithfulness", "deletion_road"), ("sanity",
            "spearman_after_randomising_all"), ("shortcut", "background_share_agreeing")} <= families
    for r in vit:  # every number has its control beside it
        controls = [k for k in r if k.startswith("control_") and r[k] is not None]
        assert controls, r
    assert {r["method"] for r in rows if r["model"] == "tiny-resnet-sup"} == {"gradcam"}
    verdicts = {r["method"]: r["note"] for r in rows if r["metric"] == "background_share_vs_unbiased_twin"}
    assert set(verdicts) == {"rollout"}  # the spurious model against its unbiased twin, per method
    assert all(v.startswith(("shows the shortcut", "cannot show the shortcut")) for v in verdicts.values())
    figures = {Path(f).stem for f in doc["analyses"]["explanations"]["files"]["figures"]}
    assert {"maps_tiny-vit-sup-spurious", "maps_tiny-resnet-sup"} <= figures
    assert (tmp_path / "out" / "tables" / "explanations.csv").is_file()
    assert "explanations" in (tmp_path / "out" / "report.html").read_text()


def test_a_cnn_without_a_head_is_scored_by_the_cosine_to_the_next_images_embedding(world: str,
                                                                                    tmp_path: Path) -> None:
    """A headless CNN's embedding is its last feature map averaged over positions: every score is computed."""
    from helpers.hf_factories import make
    from vitscope.workflows.explanations import run_explanations

    make("bit").save_pretrained(tmp_path / "bit")
    doc = run_explanations([str(tmp_path / "bit")], world, tmp_path / "out", ["gradcam"], limit=4, steps=2)
    rows = doc["analyses"]["explanations"]["summary"]["rows"]
    assert {r["metric"] for r in rows} >= {"pointing_game", "deletion_mean", "insertion_road", "background_share"}
    assert all(r["method"] == "gradcam" for r in rows)


def test_steps_beyond_a_models_patches_stop_the_run_before_anything_is_scored(world: str, tmp_path: Path,
                                                                                monkeypatch) -> None:
    import vitscope.explain.benchmark as benchmark
    from vitscope.errors import VitscopeUsageError
    from vitscope.workflows.explanations import run_explanations

    def scored(*args, **kwargs):
        raise AssertionError("a model was scored before --steps was checked against every model")

    monkeypatch.setattr(benchmark, "benchmark_model", scored)
    # tiny-vit-sup has 64 patches and comes first; tiny-resnet-sup's 4x4 map has 16
    with pytest.raises(VitscopeUsageError, match=r"--steps 20 is more than the patches of tiny-resnet-sup \(16\).*"
                                                 r"--steps 16 or fewer"):
        run_explanations(["tiny-vit-sup", "tiny-resnet-sup"], world, tmp_path / "out", ["attention", "gradcam"],
                         limit=2, steps=20, sanity=False)
    assert not (tmp_path / "out" / "results.json").exists()


def test_a_run_in_which_no_method_fits_any_model_is_refused(world: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from vitscope.cli.main import app

    res = CliRunner().invoke(app, ["explanations", "--models", "tiny-vit-sup", "-d", world, "-o", str(tmp_path / "o"),
                                   "--methods", "gradcam", "--limit", "2", "--steps", "2", "--no-sanity"])
    assert res.exit_code == 2, res.output  # a value the models cannot take: bad usage, as README says
    assert "no method asked for runs on tiny-vit-sup" in res.output and "gradcam@tiny-vit-sup (is for CNNs)" in \
        res.output
    assert not (tmp_path / "o" / "results.json").exists()


@pytest.mark.parametrize(("models", "methods", "message"), [
    ("tiny-vit-sup", "all,rollout", "--methods all stands alone"),
    ("", "rollout", "--models names no model")])
def test_a_list_the_benchmark_cannot_read_is_bad_usage(world: str, tmp_path: Path, models, methods, message) -> None:
    """``all`` inside a list was refused as an unknown method; no model blamed --methods with an empty list."""
    from typer.testing import CliRunner

    from vitscope.cli.main import app

    res = CliRunner().invoke(app, ["explanations", "-M", models, "-d", world, "-o", str(tmp_path / "o"),
                                   "--methods", methods])
    assert res.exit_code == 2 and message in res.output, res.output
    assert not (tmp_path / "o").exists()


def test_data_without_masks_is_refused_and_leaves_no_folder(tmp_path: Path) -> None:
    import numpy as np
    from PIL import Image
    from typer.testing import CliRunner

    from vitscope.cli.main import app

    (tmp_path / "plain").mkdir()
    for i in range(2):
        Image.fromarray(np.full((32, 32, 3), 40 * i, dtype=np.uint8)).save(tmp_path / "plain" / f"{i}.png")
    res = CliRunner().invoke(app, ["explanations", "-M", "tiny-vit-sup", "-d", str(tmp_path / "plain"), "-o",
                                   str(tmp_path / "o"), "--methods", "rollout", "--steps", "1", "--no-sanity"])
    assert res.exit_code == 1 and "needs two labelled images with object masks" in res.output, res.output
    assert not (tmp_path / "o").exists()
