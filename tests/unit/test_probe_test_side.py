"""The side of a probe that gets scored: clustering scores the test images alone, k-NN records the neighbours that
voted, and features with NaN or infinite values are refused, naming the block."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from vitscope.analyses.probes.base import UnscoredProbeWarning, holdout_mask
from vitscope.analyses.probes.clustering import clustering_probe, clustering_scores
from vitscope.analyses.probes.knn import knn_scores
from vitscope.errors import DegenerateDataError, VitscopeValueError
from vitscope.functional.knn import knn_classify
from vitscope.workflows.options import ProbeOptions
from vitscope.workflows.probe import run_probe


def _class_folders(root, classes: dict[str, int]):
    for name, count in classes.items():
        (root / name).mkdir(parents=True)
        for i in range(count):
            Image.new("RGB", (16, 16), (i * 3 % 256, 40, 0)).save(root / name / f"{i}.png")
    return root


class _Swept(Exception):
    """probe_sweep was reached: a pass would have run."""


@pytest.fixture
def no_pass(monkeypatch):
    """probe_sweep raises :class:`_Swept`: a refusal must come before it."""
    from vitscope.downstream import sweep

    def reached(*args, **kwargs):
        raise _Swept

    monkeypatch.setattr(sweep, "probe_sweep", reached)


def _options(data: str, out, test_data: str | None = None, test_fraction: float = 0.2) -> ProbeOptions:
    return ProbeOptions(model="tiny-vit-sup", data=data, out=out, test_data=test_data, test_fraction=test_fraction,
                        site="resid_post", batch_size=4, device="cpu")


def test_a_one_class_held_out_part_is_refused_before_any_pass(tmp_path, no_pass) -> None:
    """68 images (a: 60, b: 5, c: 3), 5 % held out with seed 0: the 3 held-out images are all class a, which
    k-means with k = 1 scored 1.0 at every block, random chance 1.0 too."""
    root = _class_folders(tmp_path / "unbal", {"a": 60, "b": 5, "c": 3})
    held = holdout_mask(np.arange(68), 0.05, 0)
    assert held.sum() == 3 and np.flatnonzero(held).max() < 60  # the case: three held-out images, all of class a
    with pytest.raises(DegenerateDataError) as err:
        run_probe(_options(f"{root}::imagefolder", tmp_path / "out", test_fraction=0.05))
    said = str(err.value)
    assert said.startswith("the held-out test part of imagefolder data (3 images) with 1 class ('a'): "), said
    assert "need at least two classes" in said and "--test-fraction (now 0.05)" in said and "\n" not in said
    assert not (tmp_path / "out" / "results.json").exists()


def test_one_class_test_data_is_refused_before_any_pass(tmp_path, no_pass) -> None:
    train = _class_folders(tmp_path / "train", {"a": 3, "b": 3, "c": 3})
    test = _class_folders(tmp_path / "test", {"a": 4})
    with pytest.raises(DegenerateDataError, match=r"^imagefolder --test-data with 1 class \('a'\): .*need at least "
                                                  r"two classes; clustering scores the --test-data images alone$"):
        run_probe(_options(f"{train}::imagefolder", tmp_path / "out", test_data=f"{test}::imagefolder"))


@pytest.mark.parametrize("counts", [{"a": 2, "b": 1}, {"a": 1, "b": 1}])
def test_test_data_of_two_classes_reaches_the_pass(tmp_path, no_pass, counts) -> None:
    """Two test images of a class each: k-NN scores them, clustering warns (every image a cluster of its own)."""
    train = _class_folders(tmp_path / "train", {"a": 3, "b": 3})
    test = _class_folders(tmp_path / "test", counts)
    with pytest.raises(_Swept):
        run_probe(_options(f"{train}::imagefolder", tmp_path / "out", test_data=f"{test}::imagefolder"))


class _Entry:
    """The parts of a feature-cache entry that clustering_probe reads: rows of two blocks, image pooling."""

    def __init__(self, feats: np.ndarray) -> None:
        self.feats, self.blocks, self.meta = feats, [0, 1], {"request": {"pooling": "cls"}}

    def __len__(self) -> int:
        return len(self.feats)

    def block(self, b: int) -> np.ndarray:
        return self.feats + b


def test_clustering_probe_leaves_one_class_unscored_with_the_reason() -> None:
    """Rows of one class (the labels known only after the pass, or probe_sweep called directly): no numbers."""
    feats = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
    with pytest.warns(UnscoredProbeWarning, match=r"with 1 class \(2\): .*need at least two classes"):
        result = clustering_probe(_Entry(feats), np.array([2, 2, 2, -1, 2, 2]))
    assert result.tensors == {} and "1 class (2)" in result.meta["error"] and result.meta["num_rows"] == 5
    scored = clustering_probe(_Entry(feats), np.array([0, 0, 0, 1, 1, 1]))  # two classes: scored, k = 2
    assert "error" not in scored.meta and scored.meta["k"] == 2 and len(scored.tensors["purity"]) == 2


def test_knn_records_the_neighbours_that_voted() -> None:
    """6 training rows: with k = 20 every one of them votes, so the result says k_used = 6 (k: the 20 asked for)."""
    rng = np.random.default_rng(0)
    tr, te = rng.normal(size=(6, 3)), rng.normal(size=(2, 3))
    y_tr, y_te = np.array([0, 0, 0, 1, 1, 1]), np.array([0, 1])
    many = knn_scores([0], lambda b: (tr, te), y_tr, y_te, k=20).meta
    few = knn_scores([0], lambda b: (tr, te), y_tr, y_te, k=4).meta
    assert (many["k"], many["k_used"]) == (20, 6) and (few["k"], few["k_used"]) == (4, 4)


def test_knn_classify_refuses_nan_or_infinite_features() -> None:
    """A NaN row used to predict class 0 for every query (its similarities rank arbitrarily)."""
    train = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.9, 0.1], [0.1, 0.9]])
    labels = torch.tensor([1, 0, 1, 0])
    test = torch.tensor([[1.0, 0.05]])
    assert knn_classify(train, labels, test, k=2).tolist() == [1]
    bad = train.clone()
    bad[2, 1] = float("nan")
    with pytest.raises(VitscopeValueError, match="train_feats contain NaN or infinite values"):
        knn_classify(bad, labels, test, k=2)
    with pytest.raises(VitscopeValueError, match="test_feats contain NaN or infinite values"):
        knn_classify(train, labels, torch.tensor([[float("inf"), 0.0]]), k=2)


def test_probes_name_the_block_whose_features_are_not_finite() -> None:
    rng = np.random.default_rng(0)
    good = rng.normal(size=(6, 3))
    bad = good.copy()
    bad[1, 2] = np.nan
    y = np.array([0, 0, 0, 1, 1, 1])
    with pytest.raises(VitscopeValueError, match=r"^knn_probe \(cls\): block 3's test features contain NaN"):
        knn_scores([2, 3], lambda b: (good, bad if b == 3 else good), y, y, pooling="cls")
    with pytest.raises(VitscopeValueError, match=r"^clustering: block 5's features contain NaN"):
        clustering_scores([4, 5], lambda b: bad if b == 5 else good, y)
