"""CKA matrices: batched HSIC, the BlockCKA / ResidualCKA accumulators, and CKA between cached models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from contract.fake_records import fake_record, fake_spec
from vitscope.analyses.representation.cka import BlockCKA, cka_between, cross_model_cka
from vitscope.analyses.representation.hsic import MinibatchHSIC
from vitscope.analyses.representation.residual import ResidualCKA
from vitscope.analyses.representation.shuffled_hsic import ShuffledHSIC, shuffled_positions
from vitscope.cache.feature_cache import FeatureCache
from vitscope.cache.rowstore import RowStore
from vitscope.functional import features_for_cka, hsic, linear_cka, minibatch_cka
from vitscope.functional.cka_grams import cka_from_hsic, grams, hsic_matrix


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _reps(n: int = 40, seed: int = 0) -> list[torch.Tensor]:
    """Three related representations of n examples with different widths."""
    g = _gen(seed)
    x = torch.randn(n, 10, generator=g, dtype=torch.float64)
    y = x @ torch.randn(10, 6, generator=g, dtype=torch.float64) + 0.5 * torch.randn(n, 6, generator=g,
                                                                                       dtype=torch.float64)
    z = torch.randn(n, 10, generator=g, dtype=torch.float64)
    return [x, y, z]


def _orthogonal(d: int, seed: int) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=_gen(seed), dtype=torch.float64))
    return q


# -------------------------------------------------------------------------------- batched HSIC


@pytest.mark.parametrize("unbiased", [False, True])
def test_hsic_matrix_equals_pairwise_hsic(unbiased: bool) -> None:
    reps = _reps(12)
    k = torch.stack([r @ r.T for r in reps])
    got = hsic_matrix(k, unbiased=unbiased)
    want = torch.tensor([[hsic(a, b, unbiased) for b in k] for a in k], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    cross = hsic_matrix(k[:1], k[1:], unbiased=unbiased)
    torch.testing.assert_close(cross, want[:1, 1:], rtol=1e-10, atol=1e-12)


def test_hsic_matrix_hand_computed_biased() -> None:
    # K = L = x x^T with x = (1, 0, -1): H K H = K (x is centred), HSIC = ||K||_F^2 / (n - 1)^2 = 4 / 4
    x = torch.tensor([[1.0], [0.0], [-1.0]], dtype=torch.float64)
    k = (x @ x.T)[None]
    assert hsic_matrix(k).item() == pytest.approx(1.0)


def test_cka_from_hsic_nan_without_variance() -> None:
    out = cka_from_hsic(torch.tensor([[1.0, 0.0]]), torch.tensor([4.0]), torch.tensor([1.0, 0.0]))
    assert out[0, 0].item() == pytest.approx(0.5) and torch.isnan(out[0, 1])


def test_grams_minmax_matches_functional_terms() -> None:
    from vitscope.functional import minibatch_hsic_terms

    x, y, _ = _reps(8)
    k = grams(torch.stack([x, x @ torch.randn(10, 10, generator=_gen(3), dtype=torch.float64)]), gram_minmax=True)
    h = hsic_matrix(k, unbiased=True)
    terms = minibatch_hsic_terms(x, x @ torch.randn(10, 10, generator=_gen(3), dtype=torch.float64), gram_minmax=True)
    torch.testing.assert_close(torch.tensor([h[0, 1], h[0, 0], h[1, 1]]), torch.tensor(terms, dtype=torch.float64))


# -------------------------------------------------------------------------------- CKA properties


def _block_cka(reps: list[torch.Tensor], estimator: str, batch: int = 8,
               split: list[int] | None = None) -> torch.Tensor:
    """Run BlockCKA on fake records whose three blocks hold ``reps`` as flattened 'all' tokens."""
    spec = fake_spec()
    n = reps[0].shape[0]
    acc = BlockCKA(estimator=estimator, batch=batch)
    start = 0
    for size in split or [n]:
        record, batch_obj = fake_record(spec, acc.required_hooks(spec), size, _gen(start), start_index=start)
        for i, r in enumerate(reps):
            padded = torch.zeros(size, spec.num_tokens * spec.embed_dim, dtype=torch.float64)
            padded[:, : r.shape[1]] = r[start : start + size]
            record[f"blocks.{i}.resid_post"] = padded.reshape(size, spec.num_tokens, spec.embed_dim).float()
        acc.update(record, batch_obj)
        start += size
    return acc.compute()["cka"]


@pytest.mark.parametrize("estimator", ["minibatch", "full", "full_unbiased"])
def test_block_cka_properties(estimator: str) -> None:
    x, _, _ = _reps(48, seed=1)
    q = _orthogonal(10, seed=5)
    cka = _block_cka([x, 3.7 * x @ q, x @ torch.randn(10, 10, generator=_gen(9), dtype=torch.float64)], estimator)
    assert torch.allclose(cka.diagonal(), torch.ones(3, dtype=torch.float64), atol=1e-6)  # CKA(X, X) = 1
    assert cka[0, 1].item() == pytest.approx(1.0, abs=1e-5)  # orthogonal transform and isotropic scaling
    assert cka[0, 2].item() < 0.99  # a general linear map is not an invariance
    torch.testing.assert_close(cka, cka.T)


@pytest.mark.parametrize("estimator", ["minibatch", "full", "full_unbiased"])
def test_block_cka_matches_functional(estimator: str) -> None:
    reps = _reps(30, seed=2)
    got = _block_cka(reps, estimator, batch=8, split=[7, 11, 12])
    for i in range(3):
        for j in range(3):
            if estimator == "minibatch":
                want = minibatch_cka(reps[i].float(), reps[j].float(), batch=8)
            else:
                want = linear_cka(reps[i].float(), reps[j].float(), unbiased=estimator == "full_unbiased")
            assert got[i, j].item() == pytest.approx(want, abs=1e-6), (i, j)


def test_minibatch_close_to_full_batch() -> None:
    g = _gen(4)
    x = torch.randn(1200, 16, generator=g, dtype=torch.float64)
    y = torch.tanh(x @ torch.randn(16, 12, generator=g, dtype=torch.float64)) + 0.3 * torch.randn(
        1200, 12, generator=g, dtype=torch.float64)
    state = MinibatchHSIC(batch=100, symmetric=False)
    state.add(range(1200), [x], [y])
    mini = state.cka()[0, 0].item()
    assert mini == pytest.approx(linear_cka(x, y, unbiased=True), abs=0.02)
    assert mini == pytest.approx(linear_cka(x, y), abs=0.03)


def test_minibatches_follow_dataset_index_not_arrival() -> None:
    """Minibatch of an image = index // batch: any split or order of the stream gives the same estimate."""
    x, y, _ = _reps(21, seed=6)
    whole = MinibatchHSIC(batch=8, symmetric=False)
    whole.add(range(21), [x], [y])
    parts = [MinibatchHSIC(batch=8, symmetric=False) for _ in range(3)]
    order = torch.randperm(21, generator=_gen(1)).tolist()
    for k, part in enumerate(parts):
        ids = order[k * 7 : (k + 1) * 7]
        part.add(ids, [x[ids]], [y[ids]])
    merged = parts[0].merge(parts[1]).merge(parts[2])
    assert merged.count == 21
    torch.testing.assert_close(merged.cka(), whole.cka(), rtol=1e-9, atol=1e-12)
    # the final minibatch holds images 16..20 (5 >= 4 images): it counts, and equals the functional estimate
    assert whole.cka()[0, 0].item() == pytest.approx(minibatch_cka(x.float(), y.float(), batch=8), abs=1e-9)
    with pytest.raises(ValueError, match="added twice"):
        whole.add([3], [x[:1]], [y[:1]])


@pytest.mark.parametrize("sizes", [[1] * 40, [3] * 13 + [1], [16, 16, 8], [40], [5, 2, 11, 1, 21]])
def test_minibatch_cka_does_not_depend_on_the_engine_batches(sizes: list[int]) -> None:
    """Batches of any size (1, 3, 16, all at once, uneven) give one estimate: minibatches by dataset index."""
    x, y, _ = _reps(40, seed=8)
    state, start = MinibatchHSIC(batch=8, symmetric=False), 0
    for size in sizes:
        ids = list(range(start, start + size))
        state.add(ids, [x[ids]], [y[ids]])
        start += size
        assert state.waiting_images() == start % 8  # only the minibatch still being filled waits
    assert state.cka()[0, 0].item() == pytest.approx(minibatch_cka(x.float(), y.float(), batch=8), abs=1e-9)


def _sorted_classes(n: int = 256, classes: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Two representations of n images sorted by class (as an imagefolder lists them): they share the classes'
    structure and nothing else, so their CKA within a class is about 0 and over the whole data high."""
    g = _gen(seed)
    label = torch.arange(n) * classes // n
    means = 4 * torch.randn(classes, 12, generator=g, dtype=torch.float64)
    x = means[label] + torch.randn(n, 12, generator=g, dtype=torch.float64)
    y = (means @ _orthogonal(12, seed)[:, :9])[label] + torch.randn(n, 9, generator=g, dtype=torch.float64)
    return x, y


def test_shuffled_minibatches_estimate_the_dataset_cka_on_data_sorted_by_class() -> None:
    """Minibatches of consecutive indices of class-sorted data each hold one class: a within-class CKA (about 0
    here). Shuffled ones estimate the CKA over the data, as the full-batch estimate."""
    x, y = _sorted_classes()
    full = linear_cka(x, y, unbiased=True)
    ordered = MinibatchHSIC(batch=16, symmetric=False)
    ordered.add(range(256), [x], [y])
    shuffled = ShuffledHSIC(batch=16, symmetric=False)
    shuffled.add(range(256), [x], [y])
    assert full > 0.8 and abs(ordered.cka()[0, 0].item()) < 0.2
    assert shuffled.cka()[0, 0].item() == pytest.approx(full, abs=0.05)


@pytest.mark.parametrize("seed", [0, 3])
def test_shuffled_minibatches_are_ranks_of_a_seeded_shuffle_whatever_the_batches_and_merges(seed: int,
                                                                                           tmp_path: Path) -> None:
    """Minibatch k holds ranks k * batch .. (k + 1) * batch - 1 of the seeded shuffle of the indices read (the last,
    5 images, kept): the functional estimate over the shuffled rows, whatever the engine batches, their order, a
    state file, or the merges of the processes' states."""
    from vitscope.engine.state_codec import decode, encode

    x, y, _ = _reps(45, seed=9)
    index = np.arange(100, 145)  # any indices (a process's share, a limit...)
    order = shuffled_positions(index, seed)
    assert sorted(order.tolist()) == list(range(45)) and order.tolist() != list(range(45))
    want = minibatch_cka(x[order].float(), y[order].float(), batch=8)
    parts = [ShuffledHSIC(batch=8, symmetric=False, seed=seed) for _ in range(3)]
    arrival = torch.randperm(45, generator=_gen(seed)).numpy()
    for k, ids in enumerate(np.array_split(arrival, 7)):
        parts[k % 3].add(index[ids], [x[ids].float()], [y[ids].float()])
    parts[1] = decode(encode(parts[1], rows_folder=tmp_path / "rows"))  # resumed from a state file
    merged = parts[0].merge(parts[1]).merge(parts[2])
    assert merged.count == 45
    assert merged.cka()[0, 0].item() == pytest.approx(want, abs=1e-9)
    whole = ShuffledHSIC(batch=8, symmetric=False, seed=seed)
    whole.add(index, [x.float()], [y.float()])
    torch.testing.assert_close(merged.cka(), whole.cka(), rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="seed"):
        whole.merge(ShuffledHSIC(batch=8, symmetric=False, seed=seed + 1))


def test_block_cka_order_is_an_option_recorded_in_its_result() -> None:
    """``order`` reaches the state and results.json; the default keeps the dataset's order (the 002 code's)."""
    spec = fake_spec()
    record, batch = fake_record(spec, BlockCKA().required_hooks(spec), 12, _gen(4))
    results = {}
    for order in ("dataset", "shuffled"):
        acc = BlockCKA(tokens="cls", batch=4, order=order, seed=2)
        acc.update(record, batch)
        results[order] = acc.compute()
    feats = [record[f"blocks.{i}.resid_post"][:, 0] for i in (0, 2)]
    shuffled = shuffled_positions(np.asarray(batch.indices), 2)
    assert results["dataset"]["cka"][0, 2].item() == pytest.approx(minibatch_cka(*feats, batch=4), abs=1e-9)
    assert results["shuffled"]["cka"][0, 2].item() == pytest.approx(
        minibatch_cka(feats[0][shuffled], feats[1][shuffled], batch=4), abs=1e-9)
    assert results["dataset"].meta["order"] == "dataset" and "seed" not in results["dataset"].meta
    assert (results["shuffled"].meta["order"], results["shuffled"].meta["seed"]) == ("shuffled", 2)
    assert "order" not in BlockCKA(estimator="full").compute().meta and BlockCKA().params["order"] == "dataset"
    with pytest.raises(ValueError, match="order must be one of"):
        BlockCKA(order="random")
    with pytest.raises(ValueError, match="minibatch estimator"):
        ResidualCKA(estimator="full_unbiased", order="shuffled")


def test_waiting_rows_go_to_disk_and_are_deleted_when_their_minibatch_completes() -> None:
    """Large pieces wait on disk (not in memory) and their files go once the minibatch is reduced."""
    g = _gen(11)
    x = torch.randn(12, 300_000, generator=g)  # 1.2 MB an image: every piece over the 1 MiB kept in memory
    whole = MinibatchHSIC(batch=8)
    whole.add(range(8), [x[:8]])
    state = MinibatchHSIC(batch=8)
    for i in range(0, 6, 2):
        state.add([i, i + 1], [x[i : i + 2]])
    pieces = [piece for rows in state.open[0].rows for piece in rows]
    folders = [Path(f) for piece in pieces for f, _ in piece.shards()]
    assert state.waiting_images() == 6 and state.held_bytes() == 0 and folders
    assert all(f.is_dir() for f in folders)
    state.add([6, 7], [x[6:8]])
    assert not state.open and not any(f.exists() for f in folders)
    torch.testing.assert_close(state.cka(), whole.cka(), rtol=1e-12, atol=1e-14)


def test_waiting_rows_survive_a_state_file_and_a_merge(tmp_path: Path) -> None:
    """A state saved with rows on disk resumes exactly (rows linked beside the state file), and merging copies."""
    from vitscope.engine.state_codec import decode, encode

    x = torch.randn(16, 300_000, generator=_gen(12))
    state = MinibatchHSIC(batch=8)
    state.add([0, 1, 2], [x[:3]])
    state.add([9, 10], [x[9:11]])
    tree = encode(state, rows_folder=tmp_path / "rows")
    assert (tmp_path / "rows").is_dir()
    state.add(list(range(3, 8)), [x[3:8]])  # completes minibatch 0: its files go, the saved links stay
    restored = decode(tree)
    restored.add(list(range(3, 8)), [x[3:8]])
    other = MinibatchHSIC(batch=8)
    other.add([8, 11, 12, 13, 14, 15], [x[[8, 11, 12, 13, 14, 15]]])
    merged = restored.merge(other)
    whole = MinibatchHSIC(batch=8)
    whole.add(range(16), [x])
    torch.testing.assert_close(merged.cka(), whole.cka(), rtol=1e-12, atol=1e-14)
    assert other.waiting_images() == 6  # merge left it as it was


def test_block_cka_gram_minmax_reproduces_functional() -> None:
    spec = fake_spec()
    acc = BlockCKA(batch=8, gram_minmax=True)
    record, batch = fake_record(spec, acc.required_hooks(spec), 16, _gen(0))
    acc.update(record, batch)
    feats = [features_for_cka(record[f"blocks.{i}.resid_post"], 1, "all") for i in range(3)]
    assert acc.compute()["cka"][0, 2].item() == pytest.approx(
        minibatch_cka(feats[0], feats[2], batch=8, gram_minmax=True), abs=1e-9)


def test_block_cka_too_few_images_says_so() -> None:
    spec = fake_spec()
    acc = BlockCKA()
    acc.update(*fake_record(spec, acc.required_hooks(spec), 3, _gen(0)))
    res = acc.compute()
    assert res.tensors == {} and "at least 4" in res.meta["note"]


def test_block_cka_cls_tokens_and_norm_site() -> None:
    spec = fake_spec()
    acc = BlockCKA(site="norm1", tokens="cls", estimator="full")
    assert acc.required_hooks(spec) == ["blocks.*.norm1"]
    record, batch = fake_record(spec, acc.required_hooks(spec), 10, _gen(2))
    acc.update(record, batch)
    want = linear_cka(record["blocks.0.norm1"][:, 0], record["blocks.2.norm1"][:, 0])
    assert acc.compute()["cka"][0, 2].item() == pytest.approx(want, abs=1e-7)


# -------------------------------------------------------------------------------- residual paths


def test_residual_cka_and_norm_ratio() -> None:
    spec = fake_spec()
    acc = ResidualCKA(estimator="full")
    record, batch = fake_record(spec, acc.required_hooks(spec), 9, _gen(3))
    # block 1's attention branch is a scaled copy of its skip input: CKA 1 and norm ratio 1 / 0.25
    record["blocks.1.attn_out"] = 0.25 * record["blocks.1.resid_pre"]
    acc.update(record, batch)
    res = acc.compute()
    assert res["attn_cka"][1].item() == pytest.approx(1.0, abs=1e-9)
    assert res["attn_norm_ratio"][1].item() == pytest.approx(4.0, rel=1e-6)
    skip = record["blocks.2.resid_mid"].reshape(9, -1).double()
    branch = record["blocks.2.mlp_out"].reshape(9, -1).double()
    assert res["mlp_cka"][2].item() == pytest.approx(linear_cka(skip, branch), abs=1e-7)
    assert res["mlp_norm_ratio"][2].item() == pytest.approx((skip.norm(dim=1) / branch.norm(dim=1)).mean().item())
    assert res["attn_cka_matrix"].shape == (3, 3)
    assert res["attn_cka_matrix"][1, 1].item() == pytest.approx(res["attn_cka"][1].item())
    assert not ResidualCKA().supports(fake_spec("cnn"))


# -------------------------------------------------------------------------------- across models (cache)


def _entry(cache: FeatureCache, feats: dict[int, np.ndarray], index: np.ndarray, key: str):
    store = RowStore()
    store.append({**{f"block{b}": f for b, f in feats.items()}, "index": index})
    return cache.commit(key, store, {"blocks": sorted(feats)})


def test_cka_between_cached_models_matches_direct(tmp_path: Path) -> None:
    reps = [r.float().numpy() for r in _reps(32, seed=11)]
    cache = FeatureCache(tmp_path)
    idx = np.arange(32)
    a = _entry(cache, {0: reps[0], 1: reps[1]}, idx, "a" * 64)
    perm = np.random.default_rng(0).permutation(32)  # rows are matched by image index, not position
    b = _entry(cache, {0: reps[2][perm], 5: reps[1][perm]}, idx[perm], "b" * 64)
    full = cka_between(a, b, estimator="full")
    assert full.shape == (2, 2)
    assert full[1, 1].item() == pytest.approx(1.0, abs=1e-6)
    assert full[0, 0].item() == pytest.approx(linear_cka(torch.from_numpy(reps[0]), torch.from_numpy(reps[2])),
                                              abs=1e-7)
    mini = cka_between(a, b, estimator="minibatch", batch=8)
    assert mini[0, 1].item() == pytest.approx(minibatch_cka(torch.from_numpy(reps[0]), torch.from_numpy(reps[1]),
                                                            batch=8), abs=1e-7)
    matrix = cross_model_cka({"A": a, "B": b}, block={"A": 1, "B": 5}, estimator="full")
    assert matrix[0, 1].item() == pytest.approx(1.0, abs=1e-6)


def test_cka_between_cached_models_in_shuffled_minibatches(tmp_path: Path) -> None:
    reps = [r.float().numpy() for r in _reps(30, seed=13)]
    cache = FeatureCache(tmp_path)
    idx = np.arange(30)
    a = _entry(cache, {0: reps[0]}, idx, "e" * 64)
    b = _entry(cache, {0: reps[1]}, idx, "f" * 64)
    order = shuffled_positions(idx, 5)
    got = cka_between(a, b, estimator="minibatch", batch=8, order="shuffled", seed=5)
    assert got[0, 0].item() == pytest.approx(minibatch_cka(torch.from_numpy(reps[0][order]),
                                                           torch.from_numpy(reps[1][order]), batch=8), abs=1e-7)


@pytest.mark.parametrize("order", ["dataset", "shuffled"])
def test_cka_between_models_of_different_depths_pairs_each_block_of_one_with_each_of_the_other(tmp_path: Path,
                                                                                              order: str) -> None:
    reps = [r.float().numpy() for r in _reps(32, seed=17) + _reps(32, seed=18)[:1]]
    cache = FeatureCache(tmp_path)
    idx = np.arange(32)
    a = _entry(cache, {0: reps[0], 1: reps[1], 2: reps[2]}, idx, "1" * 64)  # three blocks against one
    b = _entry(cache, {0: reps[3]}, idx, "2" * 64)
    got = cka_between(a, b, estimator="minibatch", batch=8, order=order, seed=3)
    rows = shuffled_positions(idx, 3) if order == "shuffled" else idx
    want = [[minibatch_cka(torch.from_numpy(reps[i][rows]), torch.from_numpy(reps[3][rows]), batch=8)]
            for i in range(3)]
    np.testing.assert_allclose(got.numpy(), np.array(want), atol=1e-7)
    back = cka_between(b, a, estimator="minibatch", batch=8, order=order, seed=3)  # one block against three
    np.testing.assert_allclose(back.numpy(), np.array(want).T, atol=1e-7)


def test_cka_between_needs_common_images(tmp_path: Path) -> None:
    cache = FeatureCache(tmp_path)
    a = _entry(cache, {0: np.ones((4, 3), np.float32)}, np.arange(4), "c" * 64)
    b = _entry(cache, {0: np.ones((4, 3), np.float32)}, np.arange(4, 8), "d" * 64)
    with pytest.raises(ValueError, match="share no image"):
        cka_between(a, b)


def test_cross_gram_and_row_norms_are_exact_float64_in_column_blocks() -> None:
    from vitscope.functional.cka_grams import cross_gram, row_norms

    x = torch.randn(5, 3, 7, generator=_gen(12))
    y = torch.randn(4, 21, generator=_gen(13))
    want = x.reshape(5, -1).double() @ y.double().T
    torch.testing.assert_close(cross_gram(x, y, column_chunk=4), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(cross_gram(x.numpy(), y.numpy(), column_chunk=5), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(cross_gram(y), y.double() @ y.double().T, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(row_norms(x, column_chunk=2), x.reshape(5, -1).double().norm(dim=1), rtol=1e-12,
                               atol=0)
    with pytest.raises(ValueError, match="width"):
        cross_gram(x, y[:, :5])


def test_the_residual_norm_ratio_is_the_skip_over_the_branch_and_its_chart_says_so(tmp_path) -> None:
    """The ratio of paper 002 fig. 23 is ||skip|| / ||branch|| per image (the attention branch of block 0 here,
    recorded apart); the report's chart names it that way round."""
    import vitscope
    from vitscope.data.synthetic.write import synthesize

    root = synthesize(tmp_path / "world", "coco", n=4, size=64, seed=2)
    backbone = vitscope.load_model("tiny-vit-sup")
    ratio = vitscope.run(backbone, f"{root}::coco", [ResidualCKA()], batch_size=4, progress=False,
                         workers=0)["residual_cka"]
    source = vitscope.data.as_source(f"{root}::coco")
    with torch.no_grad(), backbone.record(["blocks.0.resid_pre", "blocks.0.attn_out"]) as rec:
        backbone(backbone.preprocess([source.load(i) for i in range(4)]))
        skip, branch = (rec[h].flatten(1).norm(dim=1) for h in ("blocks.0.resid_pre", "blocks.0.attn_out"))
    assert float(ratio.tensors["attn_norm_ratio"][0]) == pytest.approx(float((skip / branch).mean()), rel=1e-4)
    panel = next(f for f in ratio.figures() if f.chart is not None).chart.to_json()["panels"][1]
    assert panel["y_label"] == "norm ratio (skip / branch)" and "skip over the norm of the branch" in panel["title"]


def test_the_cls_token_of_a_model_without_one_is_refused_before_the_pass(tmp_path) -> None:
    import vitscope
    from vitscope.data.synthetic.write import synthesize
    from vitscope.errors import VitscopeValueError

    cnn = vitscope.load_model("tiny-resnet-sup")
    for analysis in (BlockCKA(tokens="cls"), ResidualCKA(tokens="cls")):
        assert "set " in (analysis.why_unsupported(cnn.spec) or "")
    root = synthesize(tmp_path / "world", "coco", n=2, size=64, seed=2)
    with pytest.raises(VitscopeValueError, match="reads the CLS token .* tiny-resnet-sup has none"):
        vitscope.run(cnn, f"{root}::coco", [BlockCKA(tokens="cls")], progress=False, workers=0)
    assert BlockCKA(tokens="cls").why_unsupported(vitscope.load_model("tiny-vit-sup").spec) is None


def test_the_cls_token_of_a_model_with_registers_only_is_refused() -> None:
    """Token 0 of a ViT without a class token (timm's ``*_reg4_gap_*``) is a register, not a CLS token."""
    import dataclasses

    from vitscope.errors import VitscopeValueError

    spec = dataclasses.replace(fake_spec(), prefix_kinds=("reg",))
    for analysis in (BlockCKA(tokens="cls"), ResidualCKA(tokens="cls")):
        assert "reads the CLS token" in (analysis.why_unsupported(spec) or "")
    acc = BlockCKA(tokens="cls", estimator="full")
    record, batch = fake_record(spec, acc.required_hooks(spec), 6, _gen(0))
    with pytest.raises(VitscopeValueError, match="needs a CLS token, but fake-vit has none"):
        acc.update(record, batch)
    assert BlockCKA(tokens="spatial_mean").why_unsupported(spec) is None


@pytest.mark.parametrize("site", ["attn.q", "attn.pattern"])
def test_per_head_sites_are_refused_not_read_as_cnn_maps(site: str) -> None:
    """``[B, H, N, Dh]`` and ``[B, H, N, N]`` are not token features: refused before the pass, and at the first batch
    when ``update`` is called directly (a CNN map ``[B, C, h, w]`` would otherwise be read from them)."""
    from vitscope.errors import VitscopeValueError

    spec = fake_spec()
    acc = BlockCKA(site=site, tokens="spatial_mean", estimator="full")
    assert "holds one tensor per head" in (acc.why_unsupported(spec) or "")
    record, batch = fake_record(spec, acc.required_hooks(spec), 6, _gen(0))
    assert record[f"blocks.0.{site}"].dim() == 4
    with pytest.raises(VitscopeValueError, match=rf"blocks.0.{site} of fake-vit is \[6, 2, 13"):
        acc.update(record, batch)
    assert BlockCKA(site="mlp_out").why_unsupported(spec) is None


def test_a_cnn_records_the_site_it_reads() -> None:
    """A CNN's CKA reads its stages whatever site was asked for, and its result says so."""
    spec = fake_spec("cnn")
    acc = BlockCKA(site="norm1", tokens="spatial_mean", estimator="full")
    assert acc.required_hooks(spec) == ["stages.*"]
    acc.update(*fake_record(spec, acc.required_hooks(spec), 6, _gen(0)))
    assert acc.compute().meta["site"] == "stages"
    vit = fake_spec()
    acc = BlockCKA(site="norm1", tokens="spatial_mean", estimator="full")
    acc.update(*fake_record(vit, acc.required_hooks(vit), 6, _gen(0)))
    assert acc.compute().meta["site"] == "norm1"


class _Labelled:
    """A source of ``labels`` in dataset order (only what DataFacts reads); counts the entries read."""

    def __init__(self, labels: list[int]) -> None:
        self._labels, self.read = labels, 0

    def __len__(self) -> int:
        return len(self._labels)

    def targets(self, i: int) -> dict:
        self.read += 1
        return {"label": self._labels[i]} if self._labels[i] >= 0 else {}


_VAL = [c for c in range(40) for _ in range(10)]  # ImageNet val's layout in small: 10 images a class, in order


@pytest.mark.parametrize("labels,limit,want", [
    ([0] * 128 + [1] * 128, None, True),  # imagefolder's order: a class per minibatch, two classes in all
    (_VAL, None, True),  # one or two classes a minibatch, the class boundaries off the minibatches'
    ([_VAL[i] for i in np.random.default_rng(0).permutation(len(_VAL))], None, False),  # the same, shuffled
    ([0, 1] * 128, None, False),  # mixed minibatches
    ([0] * 256, None, False),  # one class: nothing to mix
    ([0] * 128 + [1] * 128, 100, False),  # the pass reads class 0 only
    ([0] * 64 + [1] * 64 + [-1] * 128, None, True),  # unlabelled entries are unknown, not another class
])
def test_sorted_by_class_reads_the_first_minibatches_and_a_spread(labels, limit, want) -> None:
    from vitscope.analyses.data_checks import DataFacts, sorted_by_class

    source = _Labelled(labels)
    assert sorted_by_class(DataFacts(source, targets={"label"}, limit=limit), batch=16) is want
    assert source.read <= 4 * 16 + 64  # a few entries, never every image of a streamed dataset
    assert sorted_by_class(DataFacts(_Labelled(labels), targets=(), limit=limit), batch=16) is False  # no labels


def test_sorted_by_class_warns_on_sorted_data_and_not_on_its_shuffles() -> None:
    """Over many label sets (2 to 60 classes, uneven sizes of 8 to 80 images): sorted, always; shuffled, never."""
    from vitscope.analyses.data_checks import DataFacts, sorted_by_class

    rng = np.random.default_rng(1)
    for _ in range(100):
        sizes = rng.integers(8, 81, size=int(rng.integers(2, 61)))
        labels = np.repeat(np.arange(len(sizes)), sizes)
        batch = int(rng.choice([8, 16, 32]))
        if len(labels) < 2 * batch:
            continue
        assert sorted_by_class(DataFacts(_Labelled(labels.tolist()), targets={"label"}), batch), (sizes, batch)
        shuffled = rng.permutation(labels).tolist()
        assert not sorted_by_class(DataFacts(_Labelled(shuffled), targets={"label"}), batch), (sizes, batch)


def test_same_class_pairs_by_hand() -> None:
    from vitscope.analyses.data_checks import same_class_pairs

    assert same_class_pairs(np.array([0, 0, 1, 1])) == pytest.approx(4 / 12)  # 4 of the 12 ordered pairs
    assert same_class_pairs(np.array([3, 3, 3, -1])) == 1.0 and same_class_pairs(np.array([5, -1])) is None


def test_minibatch_cka_in_dataset_order_warns_on_data_sorted_by_class(tmp_path) -> None:
    """imagefolder lists its images class by class: dataset-order minibatches are one class each, and the run says
    so before the pass with the option that fixes it; shuffled minibatches and the full estimator do not warn."""
    import warnings

    import numpy as np
    from PIL import Image

    import vitscope
    from vitscope.analyses.representation.cka_state import SortedMinibatchWarning
    from vitscope.analyses.representation.residual import ResidualCKA

    rng = np.random.default_rng(0)
    for c in ("cat", "dog"):  # 8 images a class, listed class by class
        (tmp_path / "f" / c).mkdir(parents=True)
        for i in range(8):
            Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(tmp_path / "f" / c / f"{i}.png")
    root = f"{tmp_path / 'f'}::imagefolder"
    backbone = vitscope.load_model("tiny-vit-sup")
    for analysis in (BlockCKA(tokens="cls", batch=4), ResidualCKA(tokens="cls", batch=4)):
        with pytest.warns(SortedMinibatchWarning, match=rf"{analysis.name}.order=shuffled"):
            found = vitscope.run(backbone, root, [analysis], batch_size=16, limit=16, progress=False, workers=0)
        assert found[analysis.name].meta["sorted_by_class"] is True  # results.json says so beside the numbers
    with warnings.catch_warnings():
        warnings.simplefilter("error", SortedMinibatchWarning)
        for quiet in (BlockCKA(tokens="cls", batch=4, order="shuffled"), BlockCKA(tokens="cls", estimator="full")):
            found = vitscope.run(backbone, root, [quiet], batch_size=16, limit=16, progress=False, workers=0)
            assert "sorted_by_class" not in found["cka"].meta
