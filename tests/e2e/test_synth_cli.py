"""`vitscope synth` writes every format; load_dataset detects and reads it back with the world's ground truth."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import vitscope
from vitscope.analyses import MeanActivation
from vitscope.cli.main import app
from vitscope.data.formats.errors import DatasetFormatError
from vitscope.data.load import FORMATS, detect_format, load_dataset
from vitscope.data.synthetic import SyntheticWorld

runner = CliRunner()


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("synth")
    for fmt in FORMATS:
        res = runner.invoke(app, ["synth", "--out", str(root / fmt), "--format", fmt, "--n", "6", "--size", "64",
                                  "--seed", "3"])
        assert res.exit_code == 0, res.output
    return root


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_is_detected_and_read(written, fmt):
    root = written / fmt
    assert detect_format(root) == fmt  # the folder synth wrote (list: list.txt beside images/)
    if fmt == "list":
        root = root / "list.txt"
        assert detect_format(root) == fmt
    ds = load_dataset(root)
    assert len(ds) > 0
    first, last = ds[0], ds[-1]
    assert type(first) is type(last)
    settings = json.loads((written / fmt / "synth.json").read_text())
    assert settings["seed"] == 3 and settings["size"] == 64


def test_coco_ground_truth_equals_the_world(written):
    world = SyntheticWorld(num_classes=10, size=64, seed=3)
    ds = load_dataset(written / "coco", "coco")
    for i in range(len(ds)):
        scene, item = world.scene(i), ds[i]
        visible = [o for o in scene.objects if o.mask.any()]
        assert item.label == scene.label
        assert sorted(item.instance_labels.tolist()) == sorted(o.class_id for o in visible)
        np.testing.assert_allclose(sorted(map(tuple, item.boxes)), sorted(tuple(o.box) for o in visible))


def test_imagefolder_labels_follow_the_world(written):
    world = SyntheticWorld(num_classes=10, size=64, seed=3)
    ds = load_dataset(written / "imagefolder")
    labels = sorted(item.label for item in ds)
    assert labels == sorted(world.scene(i).label for i in range(6))


def test_synth_is_deterministic(tmp_path):
    for run in ("a", "b"):
        assert runner.invoke(app, ["synth", "--out", str(tmp_path / run), "--format", "imagefolder", "--n", "4",
                                   "--size", "64"]).exit_code == 0
    a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.png"))
    assert a == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*.png"))
    for rel in a:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()


def test_engine_reads_annotated_formats(written):
    tiny = vitscope.load_model("tiny-vit")
    res = vitscope.run(tiny, f"{written / 'coco'}::coco", [MeanActivation()], batch_size=4, progress=False)
    assert res.num_images == 6


def test_bad_inputs(tmp_path):
    with pytest.raises(DatasetFormatError, match="does not exist"):
        load_dataset(tmp_path / "missing")
    with pytest.raises(DatasetFormatError, match="Did you mean coco"):
        load_dataset(tmp_path, "cocoo")
    (tmp_path / "file.bin").write_bytes(b"")
    with pytest.raises(DatasetFormatError, match="cannot tell the format"):
        detect_format(tmp_path)
    res = runner.invoke(app, ["synth", "--out", str(tmp_path / "x"), "--format", "nope"])
    assert res.exit_code == 2 and "unknown format" in res.output  # bad usage (docs/errors.md)
    res = runner.invoke(app, ["synth", "--out", str(tmp_path / "x"), "--format", "coco", "--spurious", "1.5"])
    assert res.exit_code == 2 and "--spurious must be a probability" in res.output
