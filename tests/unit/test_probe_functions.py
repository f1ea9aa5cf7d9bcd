"""Pure maths of the probes, hand-computed: propagation, correspondence, pooling, linear probe, scoring."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from vitscope.analyses.probes.base import holdout_mask
from vitscope.analyses.probes.result import best_block_table, probe_result
from vitscope.cache.feature_cache import FeatureCache
from vitscope.cache.rowstore import RowStore
from vitscope.downstream.davis import evaluate_sequence, propagate_sequence
from vitscope.downstream.keypoints import sample_pairs
from vitscope.downstream.retrieval import retrieval_scores
from vitscope.functional.correspondence import letterbox_geometry, transfer_keypoints
from vitscope.functional.linear_probe import linear_probe_accuracy, train_linear_probe
from vitscope.functional.pooling import mask_pool, mask_weights, random_features
from vitscope.functional.propagation import (
    first_frame_labels,
    labels_to_mask,
    neighborhood_mask,
    propagate_labels,
)
from vitscope.functional.video import davis_f

# ------------------------------------------------------------------------------------------ propagation


def test_neighborhood_mask_is_chebyshev() -> None:
    m = neighborhood_mask((3, 3), 1)
    assert m[0].reshape(3, 3).tolist() == [[True, True, False], [True, True, False], [False, False, False]]
    assert m[4].all()  # the centre sees every token at distance <= 1


def test_propagation_weights_are_softmax_over_top_k() -> None:
    # 1 x 3 grid, one context frame; the target token 0 has cosine 1, 0.8, 0 with the context tokens
    context = torch.tensor([[[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]]])
    target = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    labels = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]]])  # [C=1, M=2, K=3]
    out = propagate_labels(target, context, labels, (1, 3), topk=2, radius=-1, temperature=0.1)
    w = math.exp(1 / 0.1) / (math.exp(1 / 0.1) + math.exp(0.8 / 0.1))
    assert out[:, 0].tolist() == pytest.approx([w, 1 - w])
    # topk=1 copies the label of the most similar token
    one = propagate_labels(target, context, labels, (1, 3), topk=1, radius=-1)
    assert one[:, 0].tolist() == pytest.approx([1.0, 0.0]) and one[:, 2].tolist() == pytest.approx([0.0, 1.0])
    # a window of radius 0 only lets token j read context token j
    local = propagate_labels(target, context, labels, (1, 3), topk=1, radius=0)
    assert local[:, 1].tolist() == pytest.approx([0.0, 1.0]) and local[:, 0].tolist() == pytest.approx([1.0, 0.0])
    # chunking the targets changes nothing
    torch.testing.assert_close(propagate_labels(target, context, labels, (1, 3), topk=2, chunk=1), out)


def test_propagation_at_a_small_temperature_is_the_float64_softmax() -> None:
    """exp(sim / T) overflowed float32 below T = 1/88.7: every soft label was NaN at T = 0.01."""
    g = torch.Generator().manual_seed(0)
    target = torch.randn(16, 8, generator=g)
    context = (target + 0.3 * torch.randn(16, 8, generator=g))[None]
    labels = torch.rand(1, 2, 16, generator=g)
    out = propagate_labels(target, context, labels, (4, 4), topk=3, radius=1, temperature=0.01)
    sims = torch.nn.functional.normalize(context[0].double(), dim=1) @ \
        torch.nn.functional.normalize(target.double(), dim=1).T  # [context, target]
    sims = sims.masked_fill(~neighborhood_mask((4, 4), 1), -math.inf)
    top = sims.topk(3, dim=0)
    weights = torch.zeros_like(sims).scatter(0, top.indices, (top.values / 0.01).softmax(dim=0))
    assert not out.isnan().any()
    torch.testing.assert_close(out.double(), labels[0].double() @ weights, atol=1e-5, rtol=1e-5)


def test_first_frame_labels_and_mask_postprocessing() -> None:
    mask = np.zeros((4, 4), dtype=np.uint8)
    mask[:, 2:] = 2
    onehot = first_frame_labels(mask, (2, 2))
    assert onehot.shape == (3, 2, 2)  # channels 0..max
    assert onehot[2].tolist() == [[0.0, 1.0], [0.0, 1.0]] and onehot[1].sum() == 0
    soft = torch.tensor([[[0.9, 0.1]], [[0.1, 0.9]]])  # [M=2, h=1, w=2]
    out = labels_to_mask(soft, patch=2, out_hw=(4, 8))
    assert out.shape == (4, 8) and out.dtype == np.uint8
    assert (out[:, :4] == 0).all() and (out[:, 4:] == 1).all()
    # each channel min-max normalised before the argmax: [1, 0] and [0, 1] (raw values would give [0, 0]); a
    # constant channel is kept as it is (0.3 < 1)
    soft = torch.tensor([[[0.6, 0.5]], [[0.1, 0.45]], [[0.3, 0.3]]])
    assert labels_to_mask(soft, patch=1, out_hw=(1, 2)).tolist() == [[0, 1]]


def test_sequence_with_oracle_features_is_perfect() -> None:
    """Features that are the one-hot object index of each token propagate the annotation exactly."""
    masks = np.zeros((5, 16, 16), dtype=np.uint8)
    for t in range(5):
        masks[t, 4:12, 2 + 2 * t : 8 + 2 * t] = 1  # an object moving right by one token per frame
    grid = (8, 8)
    small = masks[:, ::2, ::2]  # token (r, c) covers pixels 2r..2r+1
    feats = np.stack([np.stack([small[t] == 0, small[t] == 1, np.zeros_like(small[t])], -1).reshape(64, 3)
                      for t in range(5)]).astype(np.float32) + 1e-3
    preds = propagate_sequence(feats, masks[0], grid, patch=2, frame_hw=(16, 16))
    j, f = evaluate_sequence(preds, masks)
    assert len(j) == 1 and j[0] == pytest.approx(1.0) and f[0] == pytest.approx(1.0)
    # a wrong annotation moved away scores low
    assert evaluate_sequence([np.zeros((16, 16), np.uint8)] * 5, masks)[0][0] == 0.0


def test_evaluate_sequence_drops_first_and_last_frames_and_void() -> None:
    truth = np.zeros((4, 4, 4), dtype=np.uint8)
    truth[:, :2, :2] = 1
    truth[2, 3, 3] = 255  # void pixel
    preds = [np.zeros((4, 4), np.uint8) for _ in range(4)]
    preds[1][:2, :2] = 1  # frame 1: perfect
    preds[2][:2, :1] = 1  # frame 2: half the object
    preds[2][3, 3] = 1  # predicted on a void pixel: a false positive (official), ignored with void="ignore"
    preds[3][:] = 0  # the last frame is not evaluated
    j, f = evaluate_sequence(preds, truth)
    assert j == [pytest.approx((1.0 + 2 / 5) / 2)]  # frame 2: 2 of 4 object pixels, plus the void one
    want_f = (davis_f(preds[1], truth[1] == 1) + davis_f(preds[2] == 1, truth[2] == 1)) / 2
    assert f == [pytest.approx(want_f)]
    j, f = evaluate_sequence(preds, truth, void="ignore")
    assert j == [pytest.approx((1.0 + 0.5) / 2)]
    valid = truth[2] != 255
    want_f = (davis_f(preds[1], truth[1] == 1) + davis_f((preds[2] == 1) & valid, (truth[2] == 1) & valid)) / 2
    assert f == [pytest.approx(want_f)]


# ------------------------------------------------------------------------------------------ keypoints


def test_letterbox_geometry_as_the_002_code() -> None:
    box = letterbox_geometry((50, 100), (64, 64))  # landscape: width fills, height round(64 * 50 / 100) = 32
    assert (box.scale, box.new_size, box.top, box.left) == (0.64, (32, 64), 16, 0)
    np.testing.assert_allclose(box.apply(np.array([[10.0, 20.0]])), [[6.4, 20 * 0.64 + 16]])
    tall = letterbox_geometry((90, 45), (64, 64))
    assert tall.new_size == (64, 32) and tall.left == 16 and tall.top == 0


def test_transfer_finds_the_shifted_token() -> None:
    # 4 x 4 tokens with distinct orthogonal features; the target is the source shifted one token right
    d = 16
    src = torch.eye(d).reshape(d, 4, 4)
    trg = torch.roll(src, shifts=1, dims=2)
    pts = np.array([[2 * 8 + 3.5, 1 * 8 + 3.5], [0 * 8 + 3.5, 3 * 8 + 3.5]])  # centres of tokens (1, 2) and (3, 0)
    pred = transfer_keypoints(src, trg, pts, (32, 32)).numpy()
    assert (pred[:, 1] // 8).tolist() == [1, 3] and (pred[:, 0] // 8).tolist() == [3, 1]


def test_sample_pairs_draws_with_replacement_per_sorted_category() -> None:
    cats = ["b", "a", "b", "a", "a"]
    got = sample_pairs(cats, 3, seed=42)
    rng = np.random.RandomState(42)
    a, b = [1, 3, 4], [0, 2]
    assert got == [a[j] for j in rng.choice(3, 3)] + [b[j] for j in rng.choice(2, 3)]
    assert sample_pairs(cats, None) == [1, 3, 4, 0, 2]


# ------------------------------------------------------------------------------------------ pooling


def test_mask_weights_and_pool_hand_computed() -> None:
    mask = np.zeros((1, 4, 6), dtype=bool)
    mask[0, :2, 2:4] = True  # exactly token (0, 1) of a 2 x 3 grid
    mask2 = np.zeros((1, 4, 6), dtype=bool)
    mask2[0, :2, 2:3] = True  # half of token (0, 1) ...
    mask2[0, 2:4, 4:6] = True  # ... and all of token (1, 2)
    w = mask_weights(np.concatenate([mask, mask2, np.zeros_like(mask)]), (2, 3))
    assert w[0].tolist() == [0, 1, 0, 0, 0, 0]
    assert w[1].tolist() == pytest.approx([0, 1 / 3, 0, 0, 0, 2 / 3])
    assert w[2].sum() == 0  # an empty mask keeps zero weights
    tokens = torch.arange(12, dtype=torch.float32).reshape(6, 2)
    pooled = mask_pool(tokens, w[:2])
    assert pooled[0].tolist() == [2.0, 3.0] and pooled[1].tolist() == pytest.approx([22 / 3, 25 / 3])


def test_random_features_are_seeded() -> None:
    a = random_features((3, 4), torch.Generator().manual_seed(1))
    b = random_features((3, 4), torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and a.min() >= 0 and a.max() < 1
    assert random_features((200,), torch.Generator().manual_seed(1), "gaussian").min() < 0
    with pytest.raises(ValueError, match="kind"):
        random_features((2,), torch.Generator(), "poisson")


# ------------------------------------------------------------------------------------------ linear probe


def _blobs(n: int, seed: int, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    centres = torch.tensor([[4.0, 0.0], [0.0, 4.0], [-4.0, -4.0]])
    return scale * (centres[y] + 0.5 * torch.randn(n, 2, generator=g)), y


def test_linear_probe_is_deterministic_and_learns() -> None:
    x, y = _blobs(90, 0)
    a, b = train_linear_probe(x, y, seed=3), train_linear_probe(x, y, seed=3)
    torch.testing.assert_close(a.weight, b.weight, rtol=0, atol=0)
    assert not torch.equal(train_linear_probe(x, y, seed=4).weight, a.weight)
    xt, yt = _blobs(30, 1)
    assert linear_probe_accuracy(x, y, xt, yt) == 1.0
    assert linear_probe_accuracy(x, y, xt, yt, lr=1e-4) < 0.9  # the assertion above can fail
    # batch norm copes with features a thousand times larger
    assert linear_probe_accuracy(1000 * x, y, 1000 * xt, yt, batch_norm=True) == 1.0
    assert math.isnan(linear_probe_accuracy(x, y, xt[:0], yt[:0]))


def test_a_linear_probe_does_not_depend_on_the_features_offset_or_scale() -> None:
    """Logistic regression's classes do not change under a per-feature affine map of the features; the probe
    trains on standardised features (folded into the returned layer), so an offset common to every image (massive
    activations) does not leave it at chance, and its logits are those of the raw features."""
    x, y = _blobs(90, 0)
    xt, yt = _blobs(30, 1)
    gen = torch.Generator().manual_seed(5)
    offset, scale = 50 * torch.randn(x.shape[1], generator=gen), torch.rand(x.shape[1], generator=gen) * 20 + 0.05
    moved, moved_t = x * scale + offset, xt * scale + offset
    assert linear_probe_accuracy(moved, y, moved_t, yt) == linear_probe_accuracy(x, y, xt, yt) == 1.0
    probe, plain = train_linear_probe(moved, y, seed=3), train_linear_probe(x, y, seed=3)
    torch.testing.assert_close(probe(moved_t), plain(xt), rtol=1e-3, atol=1e-3)  # one classifier, either units
    constant = torch.cat([x, torch.full((len(x), 1), 7.0)], dim=1)  # a feature with no spread is left as it is
    assert torch.isfinite(train_linear_probe(constant, y).weight).all()


def test_batch_norms_statistics_at_evaluation_are_the_training_sets() -> None:
    """A short training (20 steps here) leaves a moving average far from the statistics the probe trained with;
    the probe evaluates with the average over every training minibatch."""
    x, y = _blobs(90, 0)
    x = x + 40.0
    norm = train_linear_probe(x, y, batch_norm=True, batch_size=30)[0]
    torch.testing.assert_close(norm.running_mean, x.mean(dim=0), rtol=1e-5, atol=1e-4)
    assert float((norm.running_var - x.var(dim=0)).abs().max()) < 0.5 * float(x.var(dim=0).min())


def test_holdout_mask_is_per_index() -> None:
    idx = np.arange(5000)
    test = holdout_mask(idx, 0.2, seed=0)
    assert 0.17 < test.mean() < 0.23
    np.testing.assert_array_equal(holdout_mask(idx[::7], 0.2, seed=0), test[::7])  # other images do not matter
    assert (holdout_mask(idx, 0.2, seed=1) != test).any()


def _splitmix_reference(index: int, seed: int) -> float:
    """splitmix64 of (seed, index) in Python integers, mapped to [0, 1)."""
    m = 2**64
    z = (index + seed * 0x9E3779B97F4A7C15 + 0x9E3779B97F4A7C15) % m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % m
    return ((z ^ (z >> 31)) >> 11) / 2**53


@pytest.mark.parametrize("seed", [0, 7, -1, -12345, 2**64 + 3])
def test_holdout_mask_takes_any_integer_seed_modulo_two_to_the_64(seed) -> None:
    """A negative seed (``probe --seed -1``) splits as seed mod 2**64; non-negative seeds split as they did."""
    idx = np.arange(300)
    want = np.array([_splitmix_reference(int(i), seed % 2**64) < 0.3 for i in idx])
    np.testing.assert_array_equal(holdout_mask(idx, 0.3, seed=seed), want)


# ------------------------------------------------------------------------------------------ scoring


def test_best_block_table() -> None:
    a = probe_result("knn", "knn", [0, 1, 2], {"accuracy": [0.2, 0.7, 0.5]}, {"accuracy": 0.1})
    b = probe_result("davis", "davis", [0, 1, 2], {"J&F": [0.3, float("nan"), 0.6], "J": [0.1, 0.2, 0.3]}, None)
    table = best_block_table({"m": {"knn": a, "davis": b}})
    knn = table[table.task == "knn"].iloc[0]
    assert (knn.best_block, knn.score, knn.last_block_score, knn.random) == (1, 0.7, 0.5, 0.1)
    assert knn.above_random == pytest.approx(0.6)
    jf = table[table.metric == "J&F"].iloc[0]
    assert jf.best_block == 2 and math.isnan(jf.random)
    assert list(table.metric) == ["accuracy", "J&F", "J"]


def test_retrieval_scores_with_oracle_features(tmp_path: Path) -> None:
    # 2 queries, 4 database images; features = one-hot of the depicted instance
    inst = np.array([0, 1, 0, 1, 1, 0])  # queries then database
    feats = np.eye(2, dtype=np.float32)[inst] + 0.01
    gnd = [{"easy": [0, 3], "hard": [], "junk": []}, {"easy": [1], "hard": [2], "junk": []}]
    store = RowStore()
    swapped = feats.copy()
    swapped[2:] = feats[2:, ::-1]  # database features of the other instance
    store.append({"block0": feats, "block1": swapped, "index": np.arange(6)})
    entry = FeatureCache(tmp_path).commit("e" * 64, store, {"blocks": [0, 1]})
    res = retrieval_scores(entry, 2, gnd, random_kind="uniform", seed=0)
    assert res["mAP_medium"][0].item() == pytest.approx(1.0)
    assert res["mAP_medium"][1].item() < 0.5  # swapped features rank the wrong instance first
    assert res["mAP_hard"][0].item() == pytest.approx(1.0)  # query 0 has no hard positive: skipped
    assert 0.0 <= res["random_mAP_medium"].item() <= 1.0


def test_retrieval_says_why_a_protocol_has_no_score(tmp_path: Path) -> None:
    feats = np.eye(2, dtype=np.float32)[[0, 1, 0, 1]] + 0.01
    gnd = [{"easy": [], "hard": [0], "junk": []}, {"easy": [], "hard": [1], "junk": []}]  # no easy positive at all
    store = RowStore()
    store.append({"block0": feats, "index": np.arange(4)})
    res = retrieval_scores(FeatureCache(tmp_path).commit("f" * 64, store, {"blocks": [0]}), 2, gnd)
    assert math.isnan(res["mAP_easy"][0].item()) and res["mAP_hard"][0].item() == pytest.approx(1.0)
    reasons = res.to_json()["null_reasons"]
    assert reasons == {"mAP_easy": "no query has a positive under the easy protocol",
                       "random_mAP_easy": "no query has a positive under the easy protocol"}


@pytest.mark.parametrize(("regions", "classes", "said"), [
    (2, 2, "one each: region clustering needs several regions of some class"),
    (3, 1, "needs object masks of at least two classes"), (3, 2, None)])
def test_region_clustering_needs_two_classes_and_more_regions_than_classes(regions, classes, said) -> None:
    from vitscope.analyses.data_checks import region_problem

    problem = region_problem(regions, classes)
    assert problem == said if said is None else said in problem


def test_region_clustering_of_one_region_per_class_is_refused_not_scored_perfect() -> None:
    from vitscope.analyses.probes.base import UnscoredProbeWarning
    from vitscope.analyses.probes.clustering import clustering_probe

    class Regions:  # a cache entry of two region rows of two classes (a run limited to one image)
        columns, blocks, meta = ["label"], [0], {"request": {"pooling": "mask"}}

        def array(self, name: str) -> np.ndarray:
            return np.array([3, 5])

        def block(self, b: int) -> np.ndarray:
            return np.eye(2, 4)

        def __len__(self) -> int:
            return 2

    with pytest.warns(UnscoredProbeWarning, match="one each"):
        result = clustering_probe(Regions())
    assert not result.tensors and "several regions" in result.meta["error"]
