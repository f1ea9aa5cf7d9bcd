"""Probe scores: clustering, k-NN, retrieval, keypoints and DAVIS J / F (docs/methods.md sections 2 and 3)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vitscope.functional.cluster import cluster_scores, kmeans_labels, purity
from vitscope.functional.keypoints import pck
from vitscope.functional.knn import knn_classify
from vitscope.functional.retrieval_scores import (
    average_precision_revisited,
    recall_at_k_map_at_r,
    revisited_aps,
    revisited_map,
)
from vitscope.functional.video import boundary_map, davis_f, davis_j


def _unit(deg: float) -> list[float]:
    return [math.cos(math.radians(deg)), math.sin(math.radians(deg))]


# ------------------------------------------------------------------------------------- clustering


def test_cluster_scores_perfect_clustering_under_relabelling() -> None:
    true = np.array([0, 0, 1, 1, 2, 2])
    pred = np.array([2, 2, 0, 0, 1, 1])
    assert cluster_scores(true, pred) == pytest.approx({"purity": 1.0, "nmi": 1.0, "ari": 1.0})


def test_cluster_scores_by_hand() -> None:
    true = np.array([0, 0, 0, 1, 1, 2])
    pred = np.array([5, 5, 7, 7, 7, 7])
    # cluster 5 = {0, 0} votes 0 (2 right); cluster 7 = {0, 1, 1, 2} votes 1 (2 right)
    n = 6
    expected_purity = (2 + 2) / n
    # NMI (arithmetic): MI / ((H(true) + H(pred)) / 2), natural logs
    table = np.array([[2, 1], [0, 2], [0, 1]], dtype=float)  # rows: true 0, 1, 2; cols: clusters 5, 7
    p = table / n
    pt, pp = p.sum(1), p.sum(0)
    mi = sum(p[i, j] * math.log(p[i, j] / (pt[i] * pp[j])) for i in range(3) for j in range(2) if p[i, j] > 0)
    ht = -sum(v * math.log(v) for v in pt)
    hp = -sum(v * math.log(v) for v in pp)
    expected_nmi = mi / ((ht + hp) / 2)

    # ARI from pair counts
    def c2(v: float) -> float:
        return v * (v - 1) / 2

    index = sum(c2(v) for v in table.ravel())
    a, b = sum(c2(v) for v in table.sum(1)), sum(c2(v) for v in table.sum(0))
    expected_idx = a * b / c2(n)
    expected_ari = (index - expected_idx) / ((a + b) / 2 - expected_idx)

    scores = cluster_scores(true, pred)
    assert set(scores) == {"purity", "nmi", "ari"}
    assert all(isinstance(v, float) for v in scores.values())
    assert scores["purity"] == pytest.approx(expected_purity)
    assert scores["nmi"] == pytest.approx(expected_nmi, rel=1e-12)
    assert scores["ari"] == pytest.approx(expected_ari, rel=1e-12)
    assert purity(true, pred) == pytest.approx(4 / 6)

    # invariant to renaming the clusters; torch input gives the same numbers
    renamed = np.where(pred == 5, 1, 9)
    assert cluster_scores(true, renamed) == pytest.approx(scores)
    assert cluster_scores(torch.from_numpy(true), torch.from_numpy(pred)) == pytest.approx(scores)


def test_purity_is_not_symmetric() -> None:
    # one big cluster over two classes: purity 1/2; swapping roles gives 1
    true = np.array([0, 0, 1, 1])
    pred = np.array([0, 0, 0, 0])
    assert purity(true, pred) == pytest.approx(0.5)
    assert purity(pred, true) == pytest.approx(1.0)


def test_cluster_scores_errors() -> None:
    with pytest.raises(ValueError, match="same length"):
        cluster_scores(np.array([0, 1]), np.array([0, 1, 1]))
    with pytest.raises(ValueError, match="integer"):
        cluster_scores(np.array([0.5, 1.0]), np.array([0, 1]))


def test_kmeans_labels_recovers_separated_blobs_deterministically() -> None:
    g = torch.Generator().manual_seed(0)
    centres = torch.tensor([[0.0, 0.0, 0.0], [10.0, 0.0, 0.0], [0.0, 10.0, 0.0]])
    truth = torch.arange(3).repeat_interleave(20)
    feats = centres[truth] + 0.3 * torch.randn(60, 3, generator=g)
    labels = kmeans_labels(feats, 3)
    assert isinstance(labels, np.ndarray) and labels.dtype == np.int64 and labels.shape == (60,)
    assert cluster_scores(truth, labels) == pytest.approx({"purity": 1.0, "nmi": 1.0, "ari": 1.0})
    assert np.array_equal(labels, kmeans_labels(feats.numpy(), 3, seed=0))
    # any integer seed: scikit-learn's random_state is the seed modulo 2**32
    assert np.array_equal(kmeans_labels(feats, 3, seed=-1), kmeans_labels(feats, 3, seed=2**32 - 1))
    with pytest.raises(ValueError, match="k must be"):
        kmeans_labels(feats, 61)


# -------------------------------------------------------------------------------------------- k-NN


def test_knn_nearest_neighbour_k1() -> None:
    train = torch.tensor([_unit(0), _unit(90), _unit(180)])
    labels = torch.tensor([0, 1, 2])
    test = torch.tensor([_unit(10), _unit(100), _unit(170), _unit(-80)])
    pred = knn_classify(train, labels, test, k=1)
    assert pred.dtype == torch.int64
    assert pred.tolist() == [0, 1, 2, 0]  # -80 deg: 80 deg from 0, 100 from 180, 170 from 90
    sims = torch.nn.functional.normalize(test, dim=1) @ torch.nn.functional.normalize(train, dim=1).T
    assert pred.tolist() == [int(labels[i]) for i in sims.argmax(1)]


def test_knn_weighted_votes_close_neighbour_beats_two_far_ones() -> None:
    # class A (0): two neighbours at +-40 deg (cos 0.766); class B (1): one at 10 deg (cos 0.985)
    train = torch.tensor([_unit(40), _unit(-40), _unit(10), _unit(180)])
    labels = torch.tensor([0, 0, 1, 2])
    test = torch.tensor([_unit(0)])
    # T = 0.07: 2 * exp(0.766 / 0.07) ~ 1.1e5 < exp(0.985 / 0.07) ~ 1.3e6 -> B
    assert knn_classify(train, labels, test, k=3, temperature=0.07).tolist() == [1]
    # a flat temperature turns it into a majority vote -> A
    assert knn_classify(train, labels, test, k=3, temperature=100.0).tolist() == [0]
    # magnitudes do not matter (L2-normalised)
    assert knn_classify(train * torch.tensor([[5.0], [0.1], [3.0], [1.0]]), labels, 7 * test, k=3).tolist() == [1]


def test_knn_ties_go_to_lowest_label_and_large_k_is_clamped() -> None:
    train = torch.tensor([[1.0, 0.0], [2.0, 0.0]])  # same direction, equal votes
    labels = torch.tensor([3, 1])
    assert knn_classify(train, labels, torch.tensor([[1.0, 0.5]]), k=2).tolist() == [1]
    assert knn_classify(train, labels, torch.tensor([[1.0, 0.5]]), k=50, num_classes=10).tolist() == [1]


def test_knn_matches_dino_reference_and_chunking() -> None:
    g = torch.Generator().manual_seed(1)
    train = torch.randn(300, 8, generator=g)
    labels = torch.randint(0, 7, (300,), generator=g)
    test = torch.randn(97, 8, generator=g)
    k, t, c = 20, 0.07, 7
    # the DINO eval_knn recipe, written out with one-hot votes
    tr, te = torch.nn.functional.normalize(train, dim=1), torch.nn.functional.normalize(test, dim=1)
    dist, idx = (te @ tr.T).topk(k, dim=1)
    one_hot = torch.nn.functional.one_hot(labels[idx], c).to(torch.float64)
    probs = (one_hot * (dist.to(torch.float64) / t).exp().unsqueeze(-1)).sum(1)
    expected = probs.argmax(1)
    assert torch.equal(knn_classify(train, labels, test, k=k, temperature=t), expected)
    assert torch.equal(knn_classify(train, labels, test, k=k, temperature=t, chunk_size=13), expected)


def test_knn_errors() -> None:
    with pytest.raises(ValueError, match="feature sizes"):
        knn_classify(torch.randn(4, 3), torch.zeros(4, dtype=torch.long), torch.randn(2, 2))
    with pytest.raises(ValueError, match="num_classes"):
        knn_classify(torch.randn(4, 3), torch.tensor([0, 1, 2, 5]), torch.randn(2, 3), num_classes=3)


# ------------------------------------------------------------------------------ revisited retrieval


def _revisited_fixture() -> tuple[torch.Tensor, list]:
    sim = torch.tensor(
        [
            [0.9, 0.8, 0.7, 0.6, 0.5, 0.4],  # ranking 0, 1, 2, 3, 4, 5
            [0.1, 0.2, 0.3, 0.4, 0.5, 0.6],  # ranking 5, 4, 3, 2, 1, 0
        ]
    )
    gnd = [
        {"easy": [1, 4], "hard": [2], "junk": [0]},
        SimpleNamespace(easy=np.array([0]), hard=np.array([], dtype=np.int64), junk=np.array([5])),
    ]
    return sim, gnd


def test_average_precision_revisited_formula() -> None:
    # ranks 0, 1, 3 of 3 positives: 1/3 + 1/3 + (2/3 + 3/4) / 2 / 3 = 65/72
    assert average_precision_revisited([0, 1, 3], 3) == pytest.approx(65 / 72)
    # a positive that never comes back just adds nothing
    assert average_precision_revisited([0, 1, 3], 4) == pytest.approx(65 / 72 * 3 / 4)
    # first positive at rank 4: precision_0 = 0 / 4, precision_1 = 1 / 5
    assert average_precision_revisited([4], 1) == pytest.approx(0.1)
    assert average_precision_revisited([], 2) == 0.0


def test_revisited_map_protocols_by_hand() -> None:
    sim, gnd = _revisited_fixture()
    # query 0, medium: positives {1, 2, 4} at 1, 2, 4; junk {0} at 0 -> ranks 0, 1, 3 -> 65/72
    # query 0, easy: positives {1, 4}; junk {0, 2} -> ranks 0, 2 -> 1/2 + (1/2 + 2/3) / 4 = 19/24
    # query 0, hard: positive {2}; junk {0, 1, 4} -> rank 0 -> 1
    # query 1, easy = medium: positive {0} at 5, junk {5} at 0 -> rank 4 -> 0.1; hard: no positive, skipped
    assert revisited_aps(sim, gnd, "medium").tolist() == pytest.approx([65 / 72, 0.1])
    assert revisited_map(sim, gnd, "medium") == pytest.approx((65 / 72 + 0.1) / 2)
    assert revisited_map(sim, gnd, "easy") == pytest.approx((19 / 24 + 0.1) / 2)
    assert revisited_map(sim, gnd, "hard") == pytest.approx(1.0)
    hard = revisited_aps(sim, gnd, "hard")
    assert hard[0] == pytest.approx(1.0) and math.isnan(hard[1])
    # pre-resolved {"ok", "junk"} entries with protocol=None
    resolved = [{"ok": [1, 4], "junk": [0, 2]}, {"ok": [0], "junk": [5]}]
    assert revisited_map(sim, resolved, None) == pytest.approx(revisited_map(sim, gnd, "easy"))
    # numpy similarity works as well
    assert revisited_map(sim.numpy(), gnd, "medium") == pytest.approx((65 / 72 + 0.1) / 2)


def test_revisited_map_junk_really_removed() -> None:
    sim = torch.tensor([[0.9, 0.8, 0.7]])
    with_junk = [{"easy": [1], "hard": [], "junk": [0]}]
    without = [{"easy": [1], "hard": [], "junk": []}]
    assert revisited_map(sim, with_junk, "easy") == pytest.approx(1.0)
    assert revisited_map(sim, without, "easy") == pytest.approx((0 / 1 + 1 / 2) / 2)  # rank 1: (0 + 1/2) / 2


def test_revisited_map_errors() -> None:
    sim, gnd = _revisited_fixture()
    with pytest.raises(ValueError, match="protocol"):
        revisited_map(sim, gnd, "extreme")
    with pytest.raises(ValueError, match="entries"):
        revisited_map(sim, gnd[:1], "easy")
    assert math.isnan(revisited_map(sim[:1], [{"easy": [], "hard": [], "junk": []}], "easy"))


# --------------------------------------------------------------------------------- R@k and mAP@R


def test_recall_at_k_map_at_r_by_hand() -> None:
    angles = [0, 10, 22, 30, 100, 210]
    labels = torch.tensor([0, 0, 1, 0, 1, 2])  # label 2 is a singleton: skipped everywhere
    emb = torch.tensor([_unit(a) for a in angles]) * torch.tensor([[1.0], [3.0], [0.5], [2.0], [1.0], [7.0]])
    # neighbours by angle (self excluded), R = other items with the same label:
    # q0: 1(A) 2(B) 3(A) ... R=2 -> R@1 1, R@2 1, AP@R = (1) / 2 = 0.5
    # q1: 0(A) 2(B) 3(A) ... R=2 -> R@1 1, R@2 1, AP@R = 0.5
    # q2: 3(A) 1(A) 0(A) 4(B) R=1 -> R@1 0, R@2 0, R@4 1, AP@R = 0
    # q3: 2(B) 1(A) 0(A) ... R=2 -> R@1 0, R@2 1, AP@R = (1/2) / 2 = 0.25
    # q4: 3(A) 2(B) ... R=1 -> R@1 0, R@2 1, AP@R = 0
    out = recall_at_k_map_at_r(emb, labels)
    assert list(out) == ["R@1", "R@2", "R@4", "R@8", "mAP@R"]
    assert all(isinstance(v, float) for v in out.values())
    assert out == pytest.approx({"R@1": 2 / 5, "R@2": 4 / 5, "R@4": 1.0, "R@8": 1.0, "mAP@R": 1.25 / 5})
    assert recall_at_k_map_at_r(emb, labels.numpy(), ks=(1,), chunk_size=2) == pytest.approx(
        {"R@1": 2 / 5, "mAP@R": 1.25 / 5}
    )


def test_recall_at_k_all_singletons_is_nan() -> None:
    out = recall_at_k_map_at_r(torch.randn(4, 3), torch.arange(4), ks=(1,))
    assert math.isnan(out["R@1"]) and math.isnan(out["mAP@R"])


def test_recall_at_k_map_at_r_matches_pytorch_metric_learning() -> None:
    calc_mod = pytest.importorskip("pytorch_metric_learning.utils.accuracy_calculator")
    from pytorch_metric_learning.distances import CosineSimilarity
    from pytorch_metric_learning.utils.inference import CustomKNN

    g = torch.Generator().manual_seed(3)
    centres = 2.0 * torch.randn(12, 16, generator=g)
    labels = torch.randint(0, 12, (150,), generator=g)
    labels[0] = 40  # a singleton label
    emb = torch.where((labels < 12).unsqueeze(1), centres[labels.clamp(max=11)], 0.0) + torch.randn(
        150, 16, generator=g
    )
    calc = calc_mod.AccuracyCalculator(
        include=("precision_at_1", "mean_average_precision_at_r"),
        k="max_bin_count",
        knn_func=CustomKNN(CosineSimilarity()),
    )
    ref = calc.get_accuracy(emb, labels)
    ours = recall_at_k_map_at_r(emb, labels, ks=(1,))
    assert ours["R@1"] == pytest.approx(ref["precision_at_1"], abs=1e-6)
    assert ours["mAP@R"] == pytest.approx(ref["mean_average_precision_at_r"], abs=1e-6)


# -------------------------------------------------------------------------------------------- PCK


def test_pck_strictly_less_than_threshold() -> None:
    true = torch.zeros(3, 2)
    pred = torch.tensor([[3.0, 4.0], [3.0, 3.999], [30.0, 0.0]])  # distances 5, <5, 30
    assert pck(pred, true, 10.0, alpha=0.5) == pytest.approx(1 / 3)  # threshold 5: exactly 5 is wrong
    assert pck(pred, true, torch.tensor([10.0, 10.0, 61.0]), alpha=0.5) == pytest.approx(2 / 3)
    assert pck(pred.numpy(), true.numpy(), np.array([10.0, 10.0, 59.0]), alpha=0.5) == pytest.approx(1 / 3)
    assert pck(pred, true, 10.0 + 1e-9, alpha=0.5) == pytest.approx(2 / 3)


def test_pck_empty_and_errors() -> None:
    assert math.isnan(pck(torch.zeros(0, 2), torch.zeros(0, 2), 10.0, alpha=0.1))
    with pytest.raises(ValueError, match=r"\[n, 2\]"):
        pck(torch.zeros(3, 3), torch.zeros(3, 3), 1.0, alpha=0.1)
    with pytest.raises(ValueError, match="bbox_size"):
        pck(torch.zeros(3, 2), torch.zeros(3, 2), torch.ones(2), alpha=0.1)


# -------------------------------------------------------------------------------------- DAVIS J, F


def test_davis_j() -> None:
    empty = np.zeros((5, 5), dtype=np.uint8)
    assert davis_j(empty, empty) == 1.0
    a = empty.copy()
    a[0:2, 0:2] = 1  # 4 px
    b = empty.copy()
    b[1:3, 1:3] = 1  # 4 px, overlap 1
    assert davis_j(a, b) == pytest.approx(1 / 7)
    assert davis_j(torch.from_numpy(a), torch.from_numpy(a)) == 1.0
    assert davis_j(a, empty) == 0.0


def test_boundary_map_seg2bmap_by_hand() -> None:
    seg = np.zeros((4, 4), dtype=np.uint8)
    seg[1:3, 1:3] = 1
    expected = np.array([[1, 1, 1, 0], [1, 0, 1, 0], [1, 1, 1, 0], [0, 0, 0, 0]], dtype=bool)
    assert np.array_equal(boundary_map(seg), expected)
    # the bottom-right pixel is never a boundary pixel; a full mask has no boundary at all
    corner = np.zeros((3, 3), dtype=np.uint8)
    corner[2, 2] = 1
    expected = np.array([[0, 0, 0], [0, 1, 1], [0, 1, 0]], dtype=bool)
    assert np.array_equal(boundary_map(corner), expected)
    assert not boundary_map(np.ones((3, 3))).any()


def _reference_f(pred: np.ndarray, true: np.ndarray, radius: int) -> float:
    """Brute force: boundary pixels per the seg2bmap rule by loops; a pixel matches when some boundary
    pixel of the other map lies within Euclidean distance <= radius (the disk)."""

    def bmap(seg: np.ndarray) -> np.ndarray:
        h, w = seg.shape
        b = np.zeros((h, w), dtype=bool)
        for y in range(h):
            for x in range(w):
                neigh = []
                if x + 1 < w:
                    neigh.append(seg[y, x + 1])
                if y + 1 < h:
                    neigh.append(seg[y + 1, x])
                if x + 1 < w and y + 1 < h and y != h - 1 and x != w - 1:
                    neigh.append(seg[y + 1, x + 1])
                b[y, x] = any(v != seg[y, x] for v in neigh)
        return b

    bp, bt = bmap(pred), bmap(true)
    pp, pt = np.argwhere(bp), np.argwhere(bt)
    if len(pp) == 0 or len(pt) == 0:
        return float(len(pp) == len(pt))
    d = np.sqrt(((pp[:, None, :] - pt[None, :, :]) ** 2).sum(-1))
    precision = float((d.min(1) <= radius).mean())
    recall = float((d.min(0) <= radius).mean())
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


def test_davis_f_identical_empty_and_one_empty() -> None:
    m = np.zeros((40, 50), dtype=np.uint8)
    m[10:25, 12:30] = 1
    empty = np.zeros_like(m)
    assert davis_f(m, m) == 1.0
    assert davis_f(empty, empty) == 1.0
    assert davis_f(m, empty) == 0.0
    assert davis_f(empty, m) == 0.0
    assert davis_f(torch.from_numpy(m).bool(), torch.from_numpy(m)) == 1.0


def test_davis_f_shifted_square() -> None:
    true = np.zeros((100, 100), dtype=np.uint8)
    true[40:60, 40:60] = 1
    # tolerance: ceil(0.008 * sqrt(100^2 + 100^2)) = ceil(1.13) = 2 px
    for shift in (1, 2):
        pred = np.roll(true, shift, axis=1)
        assert davis_f(pred, true) == 1.0
    pred = np.roll(true, 6, axis=1)
    f = davis_f(pred, true)
    assert 0.0 < f < 1.0
    assert f == pytest.approx(_reference_f(pred, true, 2))
    assert davis_f(np.roll(true, 6, axis=1), true) < davis_f(np.roll(true, 3, axis=1), true)
    # a looser tolerance in pixels (bound_th >= 1) accepts the shift
    assert davis_f(pred, true, bound_th=6) == 1.0


def test_davis_f_matches_brute_force_on_random_blobs() -> None:
    rng = np.random.default_rng(0)
    for _ in range(5):
        h, w = rng.integers(20, 40, size=2)
        yy, xx = np.mgrid[0:h, 0:w]
        blobs = []
        for _ in range(2):
            cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(3, 10)
            blobs.append(((yy - cy) ** 2 + (xx - cx) ** 2 < r**2).astype(np.uint8))
        radius = int(np.ceil(0.05 * np.linalg.norm((h, w))))
        expected = _reference_f(blobs[0], blobs[1], radius)
        assert davis_f(blobs[0], blobs[1], bound_th=0.05) == pytest.approx(expected)


def test_davis_shape_mismatch() -> None:
    with pytest.raises(ValueError, match="same shape"):
        davis_j(np.zeros((3, 3)), np.zeros((3, 4)))
    with pytest.raises(ValueError, match="2-D"):
        davis_f(np.zeros((2, 3, 3)), np.zeros((2, 3, 3)))


def test_knn_votes_at_a_small_temperature_keep_their_ratio() -> None:
    """Cosine 0.99 to one class-1 example, 0.98 to two of class 0: at T = 0.001 class 1's vote is e^10 / 2 times
    the other's, but exp(sim / T) overflowed float64 to inf for every vote and the tie went to class 0."""
    def unit(c: float) -> list[float]:
        return [c, (1 - c * c) ** 0.5]

    train = torch.tensor([unit(0.99), unit(0.98), unit(0.98)], dtype=torch.float64)
    test = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    for temperature, expected in ((0.001, 1), (0.5, 0)):  # a warm vote: two class-0 neighbours outweigh one
        assert knn_classify(train, torch.tensor([1, 0, 0]), test, k=3, temperature=temperature).item() == expected
