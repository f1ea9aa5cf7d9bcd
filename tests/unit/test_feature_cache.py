"""The disk-backed row store, the feature cache, and one-pass cached feature extraction."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

import vitscope
from vitscope.cache import FeatureCache, FeatureRequest, RowStore
from vitscope.data import load_dataset
from vitscope.data.annotated_source import AnnotatedSource as DatasetSource
from vitscope.data.files import ImageFiles as PathSource
from vitscope.data.synthetic.write import synthesize
from vitscope.engine.extract import extract_features
from vitscope.models.views import LongSideView, StandardView

# ------------------------------------------------------------------------------------------ RowStore


def _rows(start: int, n: int, width: int = 3) -> dict[str, np.ndarray]:
    idx = np.arange(start, start + n)
    return {"index": idx, "x": np.stack([idx * 10.0 + j for j in range(width)], axis=1).astype(np.float32)}


def test_rowstore_spills_to_disk_and_reads_back(tmp_path: Path) -> None:
    store = RowStore(workdir=tmp_path, spill_bytes=100)
    for start in range(0, 30, 6):
        store.append(_rows(start, 6))
    assert len(store) == 30 and not store._memory  # every append crossed the threshold
    shards = list(tmp_path.glob("shard-*/x.bin"))
    assert len(shards) == 1 and shards[0].stat().st_size == 30 * 3 * 4
    chunks = list(store.chunks(["x"], max_rows=7))
    assert isinstance(chunks[0]["x"], np.memmap) and [len(c["x"]) for c in chunks] == [7, 7, 7, 7, 2]
    np.testing.assert_array_equal(store.column("x"), _rows(0, 30)["x"])


def test_rowstore_rejects_mismatched_rows() -> None:
    store = RowStore()
    store.append(_rows(0, 2))
    with pytest.raises(ValueError, match="rows of shape"):
        store.append(_rows(2, 2, width=4))
    with pytest.raises(ValueError, match="columns"):
        store.append({"index": np.arange(2)})
    with pytest.raises(ValueError, match="same number of rows"):
        store.append({"index": np.arange(2), "x": np.zeros((3, 3), np.float32)})


def test_rowstore_merge_and_pickle_share_only_sealed_shards(tmp_path: Path) -> None:
    a = RowStore(workdir=tmp_path / "a", spill_bytes=100)
    b = RowStore(workdir=tmp_path / "b", spill_bytes=100)
    a.append(_rows(0, 5))
    b.append(_rows(5, 5))
    b.append(_rows(10, 1))  # stays open until sealed
    a.extend(b)
    assert len(a) == 11 and b._open is None  # b's shard was sealed before a referenced it
    b.append(_rows(20, 4))  # b goes on in a new shard; a must not see these rows
    np.testing.assert_array_equal(np.sort(a.column("index")), np.arange(11))
    clone = pickle.loads(pickle.dumps(a))
    clone.append(_rows(40, 3))
    assert len(a) == 11 and len(clone) == 14
    np.testing.assert_array_equal(np.sort(a.column("index")), np.arange(11))
    out = {"x": np.zeros((11, 3), np.float32)}
    order = a.write_sorted("index", out)
    np.testing.assert_array_equal(out["x"], _rows(0, 11)["x"])
    np.testing.assert_array_equal(a.column("index")[order], np.arange(11))


# ------------------------------------------------------------------------------------------ cache


def test_cache_commit_is_atomic_sorted_and_memory_mapped(tmp_path: Path) -> None:
    cache = FeatureCache(tmp_path)
    store = RowStore()
    store.append(_rows(3, 3))
    store.append(_rows(0, 3))
    key = "ab" * 32
    assert cache.get(key) is None
    entry = cache.commit(key, store, {"blocks": [0]})
    assert entry.meta["rows"] == 6 and entry.meta["blocks"] == [0]
    np.testing.assert_array_equal(entry.index, np.arange(6))
    x = entry.array("x")
    assert isinstance(x, np.memmap) and not x.flags.writeable
    np.testing.assert_array_equal(x, _rows(0, 6)["x"])
    assert not any((tmp_path / "tmp").iterdir())  # no half-written folder is left
    assert cache.get(key).key == key and cache.keys() == [key]
    other = RowStore()
    other.append(_rows(0, 1))
    assert len(cache.commit(key, other, {})) == 6  # an existing entry wins
    with pytest.raises(KeyError, match="no column"):
        entry.array("nope")


def test_cache_evicts_least_recently_used(tmp_path: Path) -> None:
    cache = FeatureCache(tmp_path)
    keys = ["1" * 64, "2" * 64, "3" * 64]
    for k in keys[:2]:
        store = RowStore()
        store.append(_rows(0, 50))
        cache.commit(k, store, {})
    os.utime(cache._path(keys[0]) / "meta.json", (1, 1))  # key 1 is the oldest...
    cache.get(keys[0])  # ...until a hit refreshes it
    os.utime(cache._path(keys[1]) / "meta.json", (2, 2))
    one = cache.size_bytes() // 2
    cache.max_bytes = 2 * one + one // 4  # room for two entries (meta.json sizes differ by a few bytes)
    store = RowStore()
    store.append(_rows(0, 50))
    cache.commit(keys[2], store, {})
    assert set(cache.keys()) == {keys[0], keys[2]}


def test_entries_committed_together_all_stay(folder: Path, tmp_path: Path) -> None:
    """A cache with room for one entry: the extraction of two requests returns both and keeps both (an entry
    committed first is not evicted by the second), and evicts the older entries once, after the last commit."""
    backbone = vitscope.load_model("tiny-vit")
    source = DatasetSource(load_dataset(folder))
    cache = FeatureCache(tmp_path)
    extract_features(backbone, source, [FeatureRequest(pooling="all", blocks=(0,))], cache, batch_size=5)
    cache.max_bytes = 1  # full already
    cls, mean = FeatureRequest(pooling="cls", blocks=(-1,)), FeatureRequest(pooling="spatial_mean", blocks=(-1,))
    found = extract_features(backbone, source, [cls, mean], cache, batch_size=5)
    assert set(cache.keys()) == {found[cls].key, found[mean].key}  # both kept, the old entry gone
    assert found[cls].block(5).shape == (10, 128) and found[mean].block(5).shape == (10, 128)


def test_entries_in_use_inside_a_hold_are_not_evicted_until_it_ends(tmp_path: Path) -> None:
    """Entries served or committed inside held_entries (by several callers, nested holds too) stay while it is open;
    at its end the cache is fitted once, least recently used first."""
    from vitscope.cache.feature_cache import held_entries

    cache = FeatureCache(tmp_path)
    keys = ["1" * 64, "2" * 64, "3" * 64, "4" * 64]
    store = RowStore()
    store.append(_rows(0, 50))
    cache.commit(keys[0], store, {})
    cache.max_bytes = cache.size_bytes() * 3 // 2  # room for one entry
    with held_entries():
        cache.get(keys[0])
        with held_entries():
            FeatureCache(tmp_path, max_bytes=cache.max_bytes).commit(keys[1], store, {})  # another caller's
        cache.commit(keys[2], store, {})
        assert set(cache.keys()) == set(keys[:3])
        for age, key in enumerate(keys[:2]):  # older than keys[2] whatever the file system's clock resolution
            os.utime(cache._path(key) / "meta.json", (age + 1, age + 1))
    assert cache.keys() == [keys[2]]  # the last used
    cache.commit(keys[3], store, {})  # outside a hold, a commit keeps only itself
    assert cache.keys() == [keys[3]]


def test_a_block_named_twice_is_kept_once_and_only_blocks_outside_are_refused() -> None:
    assert FeatureRequest(blocks=(5, -1)).block_list(6) == [5]  # -1 is block 5 of six
    assert FeatureRequest(blocks=(3, 0, -6, 3)).block_list(6) == [0, 3]
    with pytest.raises(ValueError, match=r"^block 6 outside 0\.\.5 \(or -6\.\.-1 counting from the last\)$"):
        FeatureRequest(blocks=(5, 6)).block_list(6)
    with pytest.raises(ValueError, match=r"^blocks 7, -7 outside 0\.\.5"):
        FeatureRequest(blocks=(7, -1, -7)).block_list(6)


def test_a_failed_pass_that_cannot_resume_leaves_no_rows(folder: Path, tmp_path: Path, monkeypatch) -> None:
    """A pass with analyses riding along cannot resume: when it fails, its working folder and the rows spilled
    there go with it."""
    import functools

    from helpers.failing import FailingAnalysis
    from vitscope.engine import feature_rows

    monkeypatch.setattr(feature_rows, "RowStore", functools.partial(RowStore, spill_bytes=1 << 10))  # spill at once

    source = DatasetSource(load_dataset(folder))
    with pytest.raises(RuntimeError, match="riding"):
        extract_features(vitscope.load_model("tiny-vit"), source, [FeatureRequest(pooling="cls")],
                         FeatureCache(tmp_path), batch_size=5, analyses=[FailingAnalysis(5, "a riding analysis fails")])
    assert (tmp_path / "tmp").is_dir() and not list((tmp_path / "tmp").glob("pass-*"))


# ------------------------------------------------------------------------------------------ extraction


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthesize(tmp_path_factory.mktemp("data") / "folder", "imagefolder", n=10, size=48, seed=3)


def _counting(backbone) -> list[int]:
    calls: list[int] = []
    plain = backbone.forward

    def forward(pixels, **kwargs):
        calls.append(pixels.shape[0])
        return plain(pixels, **kwargs)

    backbone.forward = forward
    return calls


def test_one_forward_pass_for_every_request_then_none(folder: Path, tmp_path: Path) -> None:
    backbone = vitscope.load_model("tiny-vit")
    calls = _counting(backbone)
    cache = FeatureCache(tmp_path)
    source = DatasetSource(load_dataset(folder))
    cls, mean = FeatureRequest(pooling="cls"), FeatureRequest(site="norm1", pooling="spatial_mean")
    first = extract_features(backbone, source, [cls, mean], cache, batch_size=4)
    assert calls == [4, 4, 2]  # one pass over the 10 images serves both requests
    assert first[cls].blocks == list(range(6)) and first[cls].block(5).shape == (10, 128)
    again = extract_features(backbone, source, [cls, mean], cache, batch_size=4)
    assert calls == [4, 4, 2] and again[cls].key == first[cls].key
    extra = FeatureRequest(pooling="all", blocks=(-1,))
    third = extract_features(backbone, source, [cls, extra], cache, batch_size=5)
    assert calls == [4, 4, 2, 5, 5] and third[extra].blocks == [5] and third[extra].block(5).shape == (10, 65 * 128)
    # the cached rows are what a direct recording gives
    with torch.inference_mode(), backbone.record(["blocks.3.resid_post", "blocks.1.norm1"]) as rec:
        backbone(backbone.preprocess([source.load(i) for i in range(10)]))
        np.testing.assert_allclose(first[cls].block(3), rec["blocks.3.resid_post"][:, 0].numpy(), rtol=1e-5,
                                   atol=1e-5)
        np.testing.assert_allclose(first[mean].block(1), rec["blocks.1.norm1"][:, 1:].mean(1).numpy(), rtol=1e-5,
                                   atol=1e-5)


def test_key_changes_with_weights_data_view_and_site(folder: Path, tmp_path: Path) -> None:
    backbone = vitscope.load_model("tiny-vit")
    calls = _counting(backbone)
    cache = FeatureCache(tmp_path)
    paths = sorted(str(p) for p in Path(folder).rglob("*.png"))[:4]
    request = FeatureRequest(pooling="cls")

    base = extract_features(backbone, PathSource(paths), [request], cache)[request]
    n = len(calls)
    assert extract_features(backbone, PathSource(paths), [request], cache)[request].key == base.key
    assert len(calls) == n  # reused
    with torch.no_grad():
        backbone.model.blocks[0].mlp.fc1.bias.add_(1.0)
    changed = extract_features(backbone, PathSource(paths), [request], cache)[request]
    assert changed.key != base.key and len(calls) == n + 1
    assert not np.allclose(changed.block(5), base.block(5))
    view = extract_features(backbone, PathSource(paths), [request], cache, view=LongSideView())[request]
    site = FeatureRequest(site="norm2", pooling="cls")
    other_site = extract_features(backbone, PathSource(paths), [site], cache)[site]
    assert len({changed.key, view.key, other_site.key}) == 3
    # a rewritten image file (its modification time changes) invalidates the entry
    img = Path(paths[0])
    img.write_bytes(img.read_bytes())
    os.utime(img, ns=(1, 1))
    rewritten = extract_features(backbone, PathSource(paths), [request], cache)[request]
    assert rewritten.key != changed.key


def test_two_lists_in_one_folder_are_two_cache_entries(tmp_path: Path) -> None:
    """A test list beside its train list in one folder is served its own features from a shared cache."""
    root = synthesize(tmp_path / "lists", "list", n=8, size=32, seed=0)
    rows = [line for line in (root / "list.txt").read_text().splitlines() if line and not line.startswith("#")]
    (root / "list.txt").unlink()
    (root / "train.txt").write_text("\n".join(rows[:4]) + "\n")
    (root / "test.txt").write_text("\n".join(rows[4:]) + "\n")
    backbone = vitscope.load_model("tiny-vit")
    request = FeatureRequest(pooling="cls", blocks=(-1,))

    def features(name: str, cache: FeatureCache) -> np.ndarray:
        source = DatasetSource(load_dataset(root / name, "list"))
        return np.asarray(extract_features(backbone, source, [request], cache, batch_size=4)[request].block(5))

    shared = FeatureCache(tmp_path / "shared")
    train = features("train.txt", shared)
    test = features("test.txt", shared)
    np.testing.assert_array_equal(test, features("test.txt", FeatureCache(tmp_path / "fresh")))
    assert not np.allclose(train, test)


def test_mask_pooling_rows_follow_the_regions(tmp_path: Path) -> None:
    root = synthesize(tmp_path / "coco", "coco", n=4, size=48, seed=1)
    dataset = load_dataset(root)
    backbone = vitscope.load_model("tiny-vit")
    request = FeatureRequest(pooling="mask", blocks=(0, 5))
    entry = extract_features(backbone, DatasetSource(dataset), [request], FeatureCache(tmp_path / "c"),
                             view=StandardView())[request]
    counts = [len(dataset[i].instance_labels) for i in range(4)]
    assert len(entry) <= sum(counts) and len(entry) >= 4
    np.testing.assert_array_equal(np.bincount(entry.index, minlength=4) <= np.array(counts), True)
    for row in range(len(entry)):
        i, r = int(entry.index[row]), int(entry.array("region")[row])
        assert entry.array("label")[row] == dataset[i].instance_labels[r]
    with pytest.raises(ValueError, match="no region masks"):
        extract_features(backbone, PathSource([dataset[0].image_path]), [request], FeatureCache(tmp_path / "d"))


def test_analyses_ride_on_the_extraction_pass(folder: Path, tmp_path: Path) -> None:
    from vitscope.analyses.probes.knn import KnnProbe
    from vitscope.analyses.representation.cka import BlockCKA
    from vitscope.data.annotated_source import AnnotatedSource
    from vitscope.models.views import TiledView

    backbone = vitscope.load_model("tiny-vit")
    calls = _counting(backbone)
    source = DatasetSource(load_dataset(folder))
    riding, knn = BlockCKA(batch=4), KnnProbe()
    request = FeatureRequest(pooling="cls", blocks=(-1,))
    extract_features(backbone, source, [request], FeatureCache(tmp_path), batch_size=5, analyses=[riding, knn])
    assert calls == [5, 5]  # the cached features and both analyses share one pass
    alone = vitscope.run(backbone, AnnotatedSource(load_dataset(folder)), [BlockCKA(batch=4)], batch_size=5,
                         device="cpu", progress=False)
    torch.testing.assert_close(riding.compute()["cka"], alone["cka"]["cka"])
    assert knn.compute().meta["num_rows"] == 10  # the source's labels reached the riding probe
    with pytest.raises(ValueError, match="tiled"):
        extract_features(backbone, source, [request], FeatureCache(tmp_path), view=TiledView(), analyses=[riding])


def test_a_killed_extraction_continues_where_it_stopped(folder: Path, tmp_path: Path, monkeypatch) -> None:
    backbone = vitscope.load_model("tiny-vit")
    calls = _counting(backbone)
    source = DatasetSource(load_dataset(folder))
    request = FeatureRequest(pooling="cls")
    cache, messages = FeatureCache(tmp_path / "cache"), []
    monkeypatch.setenv("VITSCOPE_STOP_AFTER_BATCHES", "2")  # saves its state, then stops as Ctrl-C would
    with pytest.raises(KeyboardInterrupt):
        extract_features(backbone, source, [request], cache, batch_size=3, checkpoint_seconds=0)
    monkeypatch.delenv("VITSCOPE_STOP_AFTER_BATCHES")
    work = list((tmp_path / "cache" / "tmp").glob("pass-*"))
    assert len(work) == 1 and list(work[0].glob("rows-rank0-of-1/shard-*/block5.bin"))  # rows are on disk
    assert calls == [3, 3] and not list(cache.keys())  # nothing committed yet
    entry = extract_features(backbone, source, [request], cache, batch_size=3, checkpoint_seconds=0,
                             log=messages.append)[request]
    assert calls == [3, 3, 3, 1]  # only the last two batches ran again
    assert any("6 images already done" in m for m in messages)
    fresh = extract_features(vitscope.load_model("tiny-vit"), source, [request], FeatureCache(tmp_path / "fresh"),
                             batch_size=3)[request]
    assert np.array_equal(entry.index, fresh.index)
    np.testing.assert_array_equal(entry.block(5), fresh.block(5))
    assert not list((tmp_path / "cache" / "tmp").glob("pass-*"))  # the working folder goes once committed


def test_a_stopped_extraction_resumed_under_strict_starts_over(folder: Path, tmp_path: Path, monkeypatch) -> None:
    """The part done without ``strict`` may have skipped images a strict pass refuses: it is not continued."""
    backbone = vitscope.load_model("tiny-vit")
    calls = _counting(backbone)
    source, request = DatasetSource(load_dataset(folder)), FeatureRequest(pooling="cls")
    cache, messages = FeatureCache(tmp_path / "cache"), []
    monkeypatch.setenv("VITSCOPE_STOP_AFTER_BATCHES", "2")
    with pytest.raises(KeyboardInterrupt):
        extract_features(backbone, source, [request], cache, batch_size=3, checkpoint_seconds=0)
    monkeypatch.delenv("VITSCOPE_STOP_AFTER_BATCHES")
    extract_features(backbone, source, [request], cache, batch_size=3, checkpoint_seconds=0, strict=True,
                     log=messages.append)
    assert calls == [3, 3, 3, 3, 3, 1]  # every batch again
    assert any("changed: strict" in m for m in messages), messages


def test_a_second_run_of_the_same_extraction_keeps_its_rows_apart(folder: Path, tmp_path: Path, monkeypatch) -> None:
    import vitscope.engine.extract as extract

    def held(fd, operation):  # another process holds the pass's lock
        raise BlockingIOError("locked")

    monkeypatch.setattr(extract.fcntl, "flock", held)
    messages: list[str] = []
    source = DatasetSource(load_dataset(folder))
    request = FeatureRequest(pooling="cls")
    entry = extract_features(vitscope.load_model("tiny-vit"), source, [request], FeatureCache(tmp_path), batch_size=4,
                             checkpoint_seconds=0, log=messages.append)[request]
    assert any("another run is extracting the same features" in m for m in messages)
    assert len(entry) == 10
    shared = [p for p in (tmp_path / "tmp").glob("pass-*") if p.is_dir()]
    assert all(not list(p.glob("state*.pt")) and not list(p.glob("rows-*")) for p in shared)  # the other's, untouched


def test_an_intervention_neither_reads_nor_fills_the_shared_cache(folder: Path, tmp_path: Path) -> None:
    """Features extracted under backbone.intervene are the edited model's (not the clean entry's), are not stored
    under the clean key, are shared by the calls inside the intervention and go when it ends."""
    backbone = vitscope.load_model("tiny-vit")
    calls = _counting(backbone)
    cache, logs = FeatureCache(tmp_path), []
    source = DatasetSource(load_dataset(folder))
    request = FeatureRequest(pooling="cls", blocks=(5,))
    clean = np.array(extract_features(backbone, source, [request], cache, batch_size=5)[request].block(5))
    n = len(calls)
    with backbone.intervene({"blocks.5.resid_post": lambda t, name: t * 0 + 1}):
        edited = extract_features(backbone, source, [request], cache, batch_size=5, log=logs.append)[request]
        np.testing.assert_array_equal(edited.block(5), np.ones((10, 128), np.float32))
        assert len(calls) == n + 2 and len(logs) == 1 and "intervene" in logs[0]
        again = extract_features(backbone, source, [request], cache, batch_size=5, log=logs.append)[request]
        assert len(calls) == n + 2 and again.path == edited.path and len(logs) == 1  # shared inside, logged once
        assert edited.path.is_relative_to(tmp_path / "tmp")
        private = edited.path
    assert not private.exists() and not list((tmp_path / "tmp").iterdir())  # gone with the intervention
    assert len(cache.keys()) == 1
    after = extract_features(backbone, source, [request], cache, batch_size=5)[request]
    np.testing.assert_array_equal(after.block(5), clean)
