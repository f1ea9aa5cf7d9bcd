"""probe refuses labelled data it cannot score (one class, or one image per class) and names the likely layout."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from vitscope.data.synthetic.write import synthesize
from vitscope.downstream.checks import require_classes
from vitscope.workflows.probe import run_probe


def _options(data: str, out) -> dict:
    return {"model": "tiny-vit-sup", "data": data, "out": str(out), "test_data": None, "test_fraction": 0.2,
            "tiling": False, "blocks": None, "site": "block", "batch_size": 4, "device": "cpu", "dtype": None,
            "seed": 0, "cache": None}


def test_a_coco_folder_read_as_imagefolder_is_one_class_and_says_coco(tmp_path) -> None:
    coco = synthesize(tmp_path / "coco", "coco", n=4, size=32, seed=0)
    folders = [p.name for p in coco.iterdir() if p.is_dir()]
    with pytest.raises(ValueError) as err:
        run_probe(_options(f"{coco}::imagefolder", tmp_path / "out"))
    message = str(err.value)
    assert "need at least two classes" in message and "class (" in message, message
    assert any(repr(f) in message for f in folders), message  # the one "class" it found, named
    assert f"pass --data {coco}::coco" in message
    assert not (tmp_path / "out" / "results.json").exists()


def test_one_image_per_class_is_refused(tmp_path) -> None:
    root = tmp_path / "flat"
    for name in ("a", "b", "c"):
        (root / name).mkdir(parents=True)
        Image.new("RGB", (32, 32), "white").save(root / name / "x.png")
    with pytest.raises(ValueError, match="3 classes of one image each"):
        run_probe(_options(f"{root}::imagefolder", tmp_path / "out"))


def test_two_classes_with_a_repeated_one_pass_the_check() -> None:
    require_classes(np.array([0, 0, 1, -1]), None, "imagefolder")  # -1: unlabelled, not a class
    with pytest.raises(ValueError, match=r"with 1 class \(0\): "):
        require_classes(np.array([0, 0, -1]), None, "imagefolder")


def test_a_one_class_training_set_is_refused_with_test_data_too(tmp_path) -> None:
    coco = synthesize(tmp_path / "coco", "coco", n=4, size=32, seed=0)
    options = _options(f"{coco}::imagefolder", tmp_path / "out") | {"test_data": f"{coco}::imagefolder"}
    with pytest.raises(ValueError, match="need at least two classes"):
        run_probe(options)
