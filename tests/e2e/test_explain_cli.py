"""End-to-end: ``vitscope explain-pair`` on images the test writes (exit codes, files, numbers)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from helpers.cli import cli


@pytest.fixture(scope="module")
def pair_files(tmp_path_factory):
    from vitscope.data.synthetic.world import SyntheticWorld

    a, b = SyntheticWorld(size=64, seed=777).pair(0)
    d = tmp_path_factory.mktemp("pair")
    Image.fromarray(a.image).save(d / "a.png")
    Image.fromarray(b.image).save(d / "b.png")
    return d / "a.png", d / "b.png"


def test_explain_pair_writes_maps_overlays_and_the_score(tmp_path, pair_files):
    a, b = pair_files
    out = tmp_path / "out"
    proc = cli("explain-pair", "--model", "tiny-vit-metric", str(a), str(b), "--out", str(out), "--transpose")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "results.json").read_text())
    entry = doc["analyses"]["paired_similarity"]
    s, files = entry["summary"], entry["files"]
    assert doc["vitscope_version"] and doc["config"]["projection"] == "head" and doc["config"]["pooling"] == "mean"
    assert f"{s['score']:.4f}" in proc.stdout and s["grid"] == [8, 8]
    assert proc.stdout.strip().splitlines()[-1] == f"report: {out / 'report.html'}" and (out / "report.html").is_file()
    with np.load(out / files["arrays"][0]) as arrays:  # arrays/paired_similarity.npz
        maps = {k: arrays[k] for k in arrays.files}
    assert set(maps) == {"map_a", "map_b", "raw_a", "raw_b", "rollout_a", "rollout_b"}
    assert maps["raw_a"].sum() == pytest.approx(s["score"], abs=1e-5) == maps["raw_b"].sum()
    assert maps["map_a"].sum() == pytest.approx(s["score"], abs=1e-5)  # R^T keeps the sum
    for name in ("a_given_b", "b_given_a", "pair"):
        assert Image.open(out / "figures" / f"{name}.png").size[0] >= 64
    assert "a.png given b.png" in (out / "report.html").read_text()  # images named by file
    # the same numbers as the Python API on the same files
    from vitscope import load_model
    from vitscope.explain import PairedSimilarity

    ps = PairedSimilarity(load_model("tiny-vit-metric"), projection="head", transpose=True)
    ref = ps.explain([Image.open(a).convert("RGB")], [Image.open(b).convert("RGB")])
    assert s["score"] == pytest.approx(float(ref.score[0]), abs=1e-5)
    assert np.allclose(maps["map_b"], ref.map_b[0].double().numpy(), atol=1e-6)


def test_explain_pair_on_a_cnn_writes_csv(tmp_path, pair_files):
    from typer.testing import CliRunner

    from vitscope.cli.main import app

    a, b = pair_files
    out = tmp_path / "cnn"
    res = CliRunner().invoke(app, ["explain-pair", "-m", "tiny-resnet-metric", str(a), str(b), "-o", str(out),
                                   "--format", "csv"])
    assert res.exit_code == 0, res.output
    entry = json.loads((out / "results.json").read_text())["analyses"]["paired_similarity"]
    s = entry["summary"]
    raw = np.loadtxt(out / "tables" / "paired_similarity_raw_a.csv", delimiter=",", skiprows=1)
    assert raw.shape == (4, 4) and raw.sum() == pytest.approx(s["score"], abs=1e-5)
    assert not any("rollout" in f for f in entry["files"]["tables"]) and s["redistribution"] is None
    map_a = np.loadtxt(out / "tables" / "paired_similarity_map_a.csv", delimiter=",", skiprows=1)
    assert torch.allclose(torch.from_numpy(raw), torch.from_numpy(map_a))


def test_explain_pair_failures_are_one_line(tmp_path, pair_files):
    a, _ = pair_files
    proc = cli("explain-pair", "--model", "tiny-vit-metric", str(a), str(tmp_path / "nope.png"),
                    "--out", str(tmp_path / "o"))
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"error: image {tmp_path / 'nope.png'} not found", proc.stderr
    assert "Traceback" not in proc.stderr
    from typer.testing import CliRunner

    from vitscope.cli.main import app

    res = CliRunner().invoke(app, ["explain-pair", "-m", "tiny-vit-metric", str(a), str(a), "-o", str(tmp_path),
                                   "--format", "xls"])
    assert res.exit_code == 2 and "--format must be one of npy, csv" in res.output, res.output  # bad usage
    assert CliRunner().invoke(app, ["explain-pair", str(a)]).exit_code == 2


@pytest.mark.parametrize("case", ["model", "image", "image_size"])
def test_a_refused_pair_leaves_no_folder(tmp_path, pair_files, case):
    from typer.testing import CliRunner

    from vitscope.cli.main import app

    a, b = pair_files
    (tmp_path / "notimg.png").write_text("no image")
    args = {"model": ["-m", "nosuch", str(a), str(b)],
            "image": ["-m", "tiny-vit-metric", str(tmp_path / "notimg.png"), str(b)],
            "image_size": ["-m", "tiny-vit-metric", str(a), str(b), "--image-size", "30"]}[case]
    res = CliRunner().invoke(app, ["explain-pair", *args, "-o", str(tmp_path / "o")])
    assert res.exit_code in (1, 2) and res.output.strip().startswith("error:"), res.output
    assert not (tmp_path / "o").exists()
