"""probe refuses labelled data it cannot score (one class, or one image per class) and names the likely layout."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from vitscope.data.synthetic.write import synthesize
from vitscope.downstream.checks import require_classes, train_numbered_labels
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


def _class_folders(root, classes: dict[str, int]):
    for name, count in classes.items():
        (root / name).mkdir(parents=True)
        for i in range(count):
            Image.new("RGB", (16, 16), (i * 30, 0, 0)).save(root / name / f"{i}.png")
    return root


class _Labels(Exception):
    """What the k-NN probe was handed (raised in its place: no feature is needed to check the labels)."""


def _probe_labels(monkeypatch, train, test, passes: list | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The train and test labels probe_sweep hands its k-NN probe (no forward pass: the extraction is stubbed and
    the sources it was asked for go to ``passes``)."""
    import vitscope
    from vitscope.downstream import sweep

    def knn(e_tr, y_tr, e_te, y_te, **kwargs):
        raise _Labels(np.asarray(y_tr), np.asarray(y_te))

    def extract(backbone, source, requests, *args, **kwargs):
        (passes if passes is not None else []).append(source)
        return dict.fromkeys(requests)

    monkeypatch.setattr(sweep, "extract_features", extract)
    monkeypatch.setattr(sweep, "knn_probe", knn)
    with pytest.raises(_Labels) as seen:
        sweep.probe_sweep(vitscope.load_model("tiny-vit"), train=train, test=test, tokens=("cls",), batch_norm=())
    return seen.value.args


def test_test_classes_are_numbered_as_the_train_data_names_them(tmp_path, monkeypatch) -> None:
    """Two folders (or lists) of one task number their classes each by its own names: the probe scores the test
    images against the train data's numbering of the same names."""
    from vitscope.data.load import load_dataset

    train = _class_folders(tmp_path / "train", {"ant": 2, "bee": 2, "cat": 2})
    test = _class_folders(tmp_path / "test", {"ant": 1, "cat": 2})  # its own numbering: ant 0, cat 1
    y_tr, y_te = _probe_labels(monkeypatch, f"{train}::imagefolder", f"{test}::imagefolder")
    assert y_tr.tolist() == [0, 0, 1, 1, 2, 2] and y_te.tolist() == [0, 2, 2]
    assert train_numbered_labels(np.array([1, -1, 0]), ["ant", "bee", "cat"], ["cat", "ant"]).tolist() == [0, -1, 2]
    (tmp_path / "train.txt").write_text("train/cat/0.png cat\ntrain/ant/0.png ant\ntrain/bee/0.png bee\n"
                                        "train/cat/1.png cat\n")
    (tmp_path / "test.txt").write_text("test/ant/0.png ant\ntest/cat/0.png cat\n")
    listed_train = load_dataset(tmp_path / "train.txt", "list")
    assert listed_train.class_names == ["ant", "bee", "cat"]  # sorted, as the class folders are
    y_tr, y_te = _probe_labels(monkeypatch, listed_train, load_dataset(tmp_path / "test.txt", "list"))
    assert y_tr.tolist() == [2, 0, 1, 2] and y_te.tolist() == [0, 2]


def test_a_test_class_the_train_data_lacks_is_refused_before_any_pass(tmp_path, monkeypatch) -> None:
    from vitscope.errors import DegenerateDataError

    train = _class_folders(tmp_path / "train", {"ant": 2, "bee": 2})
    test = _class_folders(tmp_path / "test", {"ant": 1, "cow": 1, "dog": 1})
    passes: list = []
    with pytest.raises(DegenerateDataError, match=r"the test data has 2 class\(es\) the train data lacks \(cow, "
                                                  r"dog\): a probe trained on the train data's 2 classes"):
        _probe_labels(monkeypatch, f"{train}::imagefolder", f"{test}::imagefolder", passes)
    assert passes == []
