"""A run says what it chose and what it left out: the model's input size, token grid and where its preprocessing
came from; the analyses that cannot run on the data, each with its reason (output, results.json, report)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import transformers as tf
from PIL import Image

from helpers.cli import cli

NOT_RUN = {"saliency_iou": "the data has no object masks", "clustering": "the data has no image labels",
           "knn_probe": "the data has no image labels", "linear_probe": "the data has no image labels"}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A ViT saved with save_pretrained and no preprocessor_config.json (64 px, patch 8), and 3 unlabelled photos."""
    root = tmp_path_factory.mktemp("choices")
    config = tf.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                          image_size=64, patch_size=8)
    tf.ViTModel(config, add_pooling_layer=False).save_pretrained(root / "model")
    assert not (root / "model" / "preprocessor_config.json").exists()
    photos = root / "photos"
    photos.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(rng.integers(0, 255, (80, 70, 3), dtype=np.uint8)).save(photos / f"p{i}.png")
    return root / "model", photos


def test_model_without_preprocessor_config_says_where_its_input_comes_from(saved, tmp_path):
    model, photos = saved
    proc = cli("analyze", "-m", str(model), "-d", str(photos), "-o", str(tmp_path), "-a", "attention_stats")
    assert proc.returncode == 0, proc.stderr
    line = (f"{model}: input 64x64 px (short side resized to 64 px, centre crop), token grid 8x8 (65 tokens); "
            "preprocessing: family default (no preprocessor_config.json; input size from config.json)")
    assert line in proc.stdout.splitlines()
    assert proc.stderr.splitlines()[0] == line  # also before the pass
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["models"][0]["preprocessing"].startswith("family default (no preprocessor_config.json")
    assert doc["skipped_analyses"] == []  # an analysis asked for by name is run or refused, never left out
    cost = doc["run"]  # what the pass cost: 3 images in pass_seconds, part of it waiting for the loader
    assert cost["pass_seconds"] > 0 and 0 <= cost["loader_wait"] <= 1
    assert cost["images_per_second"] == pytest.approx(3 / cost["pass_seconds"], rel=0.01)
    report = (tmp_path / "report.html").read_text()
    assert "64x64 px" in report and "family default (no preprocessor_config.json" in report


def test_image_size_sets_the_grid_and_a_default_run_lists_what_it_left_out(saved, tmp_path):
    """``--image-size 32``: a 4x4 grid everywhere (results.json, patterns); a default analyze of unlabelled photos
    without masks names each analysis it left out, with the reason, in stdout, results.json and the report."""
    model, photos = saved
    proc = cli("analyze", "-m", str(model), "-d", str(photos), "-o", str(tmp_path), "--image-size", "32")
    assert proc.returncode == 0, proc.stderr
    assert "token grid 4x4 (17 tokens); preprocessing: family default (no preprocessor_config.json; input size " \
           "from config.json); input size 32 px set by the user" in proc.stdout
    for name, reason in NOT_RUN.items():
        assert f"{name} skipped: {reason}" in proc.stdout.splitlines()
    doc = json.loads((tmp_path / "results.json").read_text())
    m = doc["models"][0]
    assert (m["image_size"], m["grid"], doc["config"]["image_size"]) == ([32, 32], [4, 4], 32)
    assert {s["analysis"]: s["reason"] for s in doc["skipped_analyses"]} == NOT_RUN
    assert not set(NOT_RUN) & set(doc["analyses"])
    entropy = np.array(doc["analyses"]["attention_stats"]["summary"]["entropy"])
    assert entropy.max() <= np.log(17) + 1e-5 < np.log(65)  # rows over 17 tokens, not the native 65
    report = (tmp_path / "report.html").read_text()
    assert "Analyses not run" in report
    assert "saliency_iou (the data has no object masks); clustering, knn_probe, linear_probe (the data has no " \
           "image labels)" in report
    assert "token grid 4x4 (17 tokens)" in report


def test_analyses_not_run_of_defaults_and_groups():
    import vitscope
    from vitscope.workflows.analyze import analyses_not_run

    vit, cnn = vitscope.load_model("tiny-vit").spec, vitscope.load_model("tiny-resnet").spec
    assert analyses_not_run(None, vit, frozenset()) == NOT_RUN
    assert analyses_not_run(None, vit, frozenset({"label", "masks"})) == {}
    assert analyses_not_run("attention,cka", vit, frozenset()) == {"saliency_iou": NOT_RUN["saliency_iou"]}
    assert analyses_not_run(["attention_stats"], vit, frozenset()) == {}
    cnn_not_run = analyses_not_run(None, cnn, frozenset({"label"}))
    assert cnn_not_run["attention_stats"] == "cannot run on tiny-resnet: the model is a CNN and has no attention"
    assert "saliency_iou" in cnn_not_run and "knn_probe" in cnn_not_run  # probes read transformer blocks


def test_compare_takes_image_size_and_lists_what_each_model_cannot_give(saved, tmp_path):
    _, photos = saved
    proc = cli("compare", "--models", "tiny-vit,tiny-resnet", "-d", str(photos), "-o", str(tmp_path), "--image-size",
               "32", "--limit", "2")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert "tiny-vit: input 32x32 px (short side resized to 32 px, centre crop), token grid 4x4 (17 tokens); " \
           "preprocessing: built-in (vitscope's tiny models); input size 32 px set by the user" in out
    cnn = "needs attention patterns, but tiny-resnet is a CNN and has no attention"
    assert f"saliency_iou skipped: tiny-vit: the data has no object masks; tiny-resnet: {cnn}" in out  # each model's
    assert f"attention_distance skipped: tiny-resnet: {cnn}" in out  # tiny-vit ran it
    doc = json.loads((tmp_path / "results.json").read_text())
    assert [m["grid"] for m in doc["models"]] == [[4, 4], [2, 2]] and doc["config"]["image_size"] == 32
    cost = doc["run"]  # both models' passes, 2 images each
    assert cost["images_per_second"] == pytest.approx(4 / cost["pass_seconds"], rel=0.01)
    assert {s["analysis"] for s in doc["skipped_analyses"]} == {"saliency_iou", "attention_distance",
                                                                "spatial_average_maps"}


def test_compare_gives_the_reason_of_every_model_that_did_not_run_an_analysis():
    from vitscope.workflows.compare import _not_run_reason

    models = ["vit", "cnn_a", "cnn_b"]
    everyone = {"vit": "the data has no object masks", "cnn_a": "the data has no object masks",
                "cnn_b": "the data has no object masks"}
    assert _not_run_reason(everyone, models) == "the data has no object masks"  # the data's lack: said once
    assert _not_run_reason({"cnn_a": "a CNN", "cnn_b": "a CNN"}, models) == "cnn_a, cnn_b: a CNN"  # vit ran it
    assert _not_run_reason({"cnn_a": "cnn_a is a CNN", "cnn_b": "cnn_b is a CNN"}, models[1:]) == \
        "cnn_a: cnn_a is a CNN; cnn_b: cnn_b is a CNN"
    assert _not_run_reason({"vit": "no masks", "cnn_a": "a CNN", "cnn_b": "no masks"}, models) == \
        "vit, cnn_b: no masks; cnn_a: a CNN"


@pytest.mark.parametrize("command", ["explain-pair", "featviz"])
def test_other_commands_take_image_size(saved, tmp_path, command):
    _, photos = saved
    args = [str(photos / "p0.png"), str(photos / "p1.png")] if command == "explain-pair" else \
        ["--unit", "blocks.1.mlp.post:3", "--steps", "1"]
    proc = cli(command, "--model", "tiny-vit", *args, "--out", str(tmp_path), "--image-size", "32")
    assert proc.returncode == 0, proc.stderr
    assert "tiny-vit: input 32x32 px (short side resized to 32 px, centre crop), token grid 4x4 (17 tokens)" \
        in proc.stdout
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["models"][0]["grid"] == [4, 4] and doc["config"]["image_size"] == 32
    if command == "explain-pair":
        assert doc["analyses"]["paired_similarity"]["summary"]["grid"] == [4, 4]
    else:
        assert Image.open(tmp_path / "figures" / "featviz_blocks_1_mlp_post_3.png").size == (32, 32)


TINY_VIT_INPUT = ("tiny-vit: input 64x64 px (short side resized to 64 px, centre crop), token grid 8x8 (65 tokens); "
                  "preprocessing: built-in (vitscope's tiny models)")


@pytest.fixture(scope="module")
def tiny_world(tmp_path_factory):
    """A COCO-format synthetic world of 4 images at 32 px (masks and labels, for explanations)."""
    from vitscope.data.synthetic.write import synthesize

    root = tmp_path_factory.mktemp("tiny_world")
    synthesize(root, "coco", n=4, size=32, seed=0)
    return root


@pytest.mark.parametrize("command", ["attribute", "artifacts", "explanations", "sae"])
def test_every_command_that_loads_a_model_says_its_input(saved, tiny_world, tmp_path, command):
    """The model's input line on stderr before the work (and in the summary where the command writes results.json):
    the same line analyze prints."""
    _, photos = saved
    out = str(tmp_path / "out")
    if command == "attribute":
        runs = [("attribute", str(photos / "p0.png"), "-m", "tiny-vit", "-o", out, "--method", "attention")]
    elif command == "artifacts":
        runs = [("artifacts", "-m", "tiny-vit", "-d", str(photos), "-o", out, "--no-ablations")]
    elif command == "explanations":
        runs = [("explanations", "-M", "tiny-vit", "-d", f"{tiny_world}::coco", "-o", out, "--methods", "attention",
                 "--limit", "2", "--steps", "2", "--no-sanity")]
    else:
        runs = [("sae", "train", "-m", "tiny-vit", "--hook", "blocks.1.resid_post", "-d", str(photos), "-o", out,
                 "--tokens", "64", "--latents", "8", "--k", "2", "--batch-tokens", "16", "--buffer-tokens", "32"),
                ("sae", "eval", "--sae", out, "-m", "tiny-vit", "-d", str(photos), "--images", "2")]
    for args in runs:
        proc = cli(*args)
        assert proc.returncode == 0, proc.stderr
        assert TINY_VIT_INPUT in proc.stderr.splitlines(), (args[:2], proc.stderr)
        if command != "sae":  # results.json written: the summary says it too
            assert TINY_VIT_INPUT in proc.stdout.splitlines(), proc.stdout
    if command == "sae":
        json.loads(proc.stdout)  # eval's stdout stays one JSON document
