"""probe refuses labelled data it cannot score (one class, or one image per class) and names the likely layout."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from vitscope.data.synthetic.write import synthesize
from vitscope.downstream.checks import require_classes
from vitscope.workflows.options import ProbeOptions
from vitscope.workflows.probe import run_probe


def _options(data: str, out, test_data: str | None = None) -> ProbeOptions:
    return ProbeOptions(model="tiny-vit-sup", data=data, out=out, test_data=test_data, site="resid_post", batch_size=4,
                        device="cpu")


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
    options = _options(f"{coco}::imagefolder", tmp_path / "out", test_data=f"{coco}::imagefolder")
    with pytest.raises(ValueError, match="need at least two classes"):
        run_probe(options)


def test_clustering_warns_when_every_row_gets_a_cluster_of_its_own() -> None:
    import warnings

    import numpy as np
    import pytest

    from vitscope.analyses.probes.clustering import clustering_scores

    labels = np.array([0, 1, 2, 3])
    feats = np.random.default_rng(0).normal(size=(4, 8)).astype(np.float32)
    with pytest.warns(UserWarning, match="4 rows in 4 clusters give every row a cluster of its own"):
        res = clustering_scores([0], lambda b: feats, labels)
    assert res.tensors["purity"].tolist() == [1.0] and float(res.tensors["random_purity"]) == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clustering_scores([0], lambda b: np.repeat(feats, 2, axis=0), np.repeat(labels, 2))  # 8 rows: no warning
