"""End-to-end: ``vitscope featviz`` (exit codes, files, results.json, report)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from vitscope.cli.main import app

runner = CliRunner()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from vitscope.data.synthetic.write import synthesize

    return synthesize(tmp_path_factory.mktemp("fv") / "data", "imagefolder", n=10, size=64, seed=0)


def test_featviz_writes_images_panels_token_mixing_and_report(tmp_path, data) -> None:
    out = tmp_path / "out"
    res = runner.invoke(app, ["featviz", "--model", "tiny-vit-sup", "--unit", "blocks.1.mlp.post:5",
                              "--unit", "blocks.0.attn.k:3", "--unit", "logit:2", "--steps", "3", "--data",
                              f"{data}::imagefolder", "--top-k", "2", "--token-mixing", "--spatial-information", "2",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "results.json").read_text())
    assert {"vitscope_version", "config", "models", "data", "analyses"} <= set(doc)
    units = doc["analyses"]["featviz"]["summary"]["units"]
    assert list(units) == ["blocks.1.mlp.post:5", "blocks.0.attn.k:3", "logit:2"]
    for u in units.values():
        assert (out / u["image"]).is_file()
    for name in ("blocks.1.mlp.post:5", "blocks.0.attn.k:3"):
        assert (out / units[name]["panel"]).is_file() and len(units[name]["top"]) == 2
        scores = [t["score"] for t in units[name]["top"]]
        assert scores == sorted(scores, reverse=True)
    assert "panel" not in units["logit:2"]
    tm = doc["analyses"]["token_mixing"]["summary"]
    assert tm["num_images"] == 10 and 0 <= tm["patch_average"] <= tm["patch_maximum"] <= 1
    spatial = doc["analyses"]["spatial_information"]["summary"]
    assert len(spatial["channels"]) == 2 and spatial["images"] == 10 and "figure" not in spatial
    chart = json.loads((out / "charts" / "spatial_information.json").read_text())
    assert doc["analyses"]["spatial_information"]["files"]["figures"] == ["charts/spatial_information.json"]
    # results.json and the chart both write a NaN (no active patch) as null: a gap in the line
    assert [c["values"] for c in chart["panels"][1]["curves"][:-1]] == spatial["sum_ratio"]  # one line per block
    token_charts = doc["analyses"]["token_mixing"]["files"]["figures"]
    assert token_charts == ["charts/token_mixing_token_accuracy.json", "charts/token_mixing_isolate_cls.json"]
    assert len(spatial["count_ratio"]) == 6 and all(row[0] == 1.0 for row in spatial["count_ratio"]
                                                    if row[0] is not None)  # null rows: no active patch
    assert len((out / "tables" / "history.csv").read_text().splitlines()) == 1 + 3 * 3
    html = (out / "report.html").read_text()
    assert "Feature visualisation" in html and "Last-layer token mixing" in html
    assert "Spatial information in single channels" in html
    assert (out / "figures" / "featviz_grid.png").is_file()
    assert doc["analyses"]["top_activations"]["files"]["arrays"] == ["arrays/top_activations.npz"]


def test_featviz_grid_across_blocks(tmp_path) -> None:
    out = tmp_path / "grid"
    res = runner.invoke(app, ["featviz", "--model", "tiny-vit-sup", "--grid", "1", "--steps", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    units = json.loads((out / "results.json").read_text())["analyses"]["featviz"]["summary"]["units"]
    assert [n.split(".")[1] for n in units] == [str(b) for b in range(6)]


@pytest.mark.parametrize("seed", [0, 1])
def test_featviz_grid_on_a_cnn_draws_each_stage_from_its_own_channels(tmp_path, seed) -> None:
    """tiny-resnet-sup's stages have 16, 32, 64 and 128 channels: seed 0 drew channel 44 for stage 0."""
    out = tmp_path / "grid"
    res = runner.invoke(app, ["featviz", "--model", "tiny-resnet-sup", "--grid", "2", "--steps", "1", "--seed",
                              str(seed), "--out", str(out)])
    assert res.exit_code == 0, res.output
    units = json.loads((out / "results.json").read_text())["analyses"]["featviz"]["summary"]["units"]
    widths = {"stages.0": 16, "stages.1": 32, "stages.2": 64, "stages.3": 128}
    drawn = [name.rpartition(":") for name in units]
    assert sorted({site for site, _, _ in drawn}) == sorted(widths) and len(drawn) == 8
    assert all(0 <= int(channel) < widths[site] for site, _, channel in drawn)


@pytest.mark.parametrize(("args", "code", "message"), [
    (["--unit", "blocks.1.mlp.post"], 2, "SITE:CHANNEL"),
    (["--unit", "blocks.1.mlp.post:99999"], 2, "out of range"),
    ([], 2, "--unit"),  # neither --unit nor --grid: bad usage
    (["--unit", "blocks.1.mlp.post:1", "--noise", "gauss"], 2, "--noise"),
    (["--unit", "blocks.1.mlp.post:1", "--token-mixing"], 2, "--data"),
])
def test_featviz_bad_usage_is_one_line(tmp_path, args, code, message) -> None:
    res = runner.invoke(app, ["featviz", "--model", "tiny-vit-sup", "--steps", "1", "--out", str(tmp_path / "o"),
                              *args])
    assert res.exit_code == code, res.output
    lines = [line for line in res.output.strip().splitlines() if line.startswith("error")]
    assert len(lines) == 1 and message in lines[0]


def test_spatial_information_on_a_cnn_is_refused_before_optimising(tmp_path) -> None:
    res = runner.invoke(app, ["featviz", "--model", "tiny-resnet-sup", "--unit", "stages.0:1", "--steps", "400",
                              "--spatial-information", "2", "--data", str(tmp_path), "--out", str(tmp_path / "o")])
    lines = [line for line in res.output.strip().splitlines() if line.startswith("error")]
    assert res.exit_code == 1 and len(lines) == 1 and "tiny-resnet-sup is a CNN" in lines[0], res.output
    assert "optimising" not in res.output
