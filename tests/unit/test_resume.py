"""Resumable runs: an interrupted run continued from its saved state equals an uninterrupted one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vitscope
from vitscope.analyses.registry import default_analyses
from vitscope.data.open import open_dataset
from vitscope.data.synthetic.write import synthesize
from vitscope.engine.provenance import data_fingerprint
from vitscope.engine.state import Checkpoint, run_key
from vitscope.engine.state_codec import StateCodecError, decode, encode
from vitscope.features.fingerprint import model_fingerprint
from vitscope.features.rowstore import RowStore


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return synthesize(tmp_path_factory.mktemp("coco"), "coco", n=22, size=64, seed=3)


def _setup(coco, batch_size=4):
    backbone = vitscope.load_model("tiny-vit")
    dataset = open_dataset(f"{coco}::coco")
    analyses = default_analyses(backbone.spec, {"label", "masks"})
    key = run_key(model_fingerprint(backbone), backbone.spec.to_dict(), data_fingerprint(dataset), analyses,
                  batch_size=batch_size)
    return backbone, dataset, analyses, key


def _assert_same(a, b):
    assert a.num_images == b.num_images and set(a) == set(b)
    for name in a:
        ta, tb = a[name].tensors, b[name].tensors
        assert set(ta) == set(tb), name
        for k in ta:
            assert torch.equal(ta[k], tb[k]) or torch.allclose(ta[k], tb[k], equal_nan=True, atol=0, rtol=0), (name, k)


def test_interrupted_then_resumed_run_equals_uninterrupted(coco, tmp_path):
    backbone, dataset, analyses, key = _setup(coco)
    reference = vitscope.run(backbone, dataset, analyses, batch_size=4, device="cpu", progress=False)

    state = tmp_path / "state.pt"
    messages: list[str] = []
    backbone, dataset, analyses, key = _setup(coco)
    first = Checkpoint(state, key, every_seconds=3600, log=messages.append, stop_after=3)
    with pytest.raises(KeyboardInterrupt):
        vitscope.run(backbone, dataset, analyses, batch_size=4, device="cpu", progress=False, checkpoint=first)
    assert state.exists() and first.saves == 1  # saved once, when stopped (not periodically: 1 h interval)

    backbone, dataset, analyses, key = _setup(coco)  # a fresh process: new model, dataset and analyses
    second = Checkpoint(state, key, every_seconds=0, log=messages.append)
    resumed = vitscope.run(backbone, dataset, analyses, batch_size=4, device="cpu", progress=False, checkpoint=second)
    assert any("resuming" in m and "12 images" in m for m in messages), messages
    assert second.batches == 3  # 22 images in batches of 4: 6 batches, 3 done before the stop
    _assert_same(reference, resumed)


def test_state_of_another_run_is_ignored_not_merged(coco, tmp_path):
    backbone, dataset, analyses, key = _setup(coco)
    state = tmp_path / "state.pt"
    with pytest.raises(KeyboardInterrupt):
        vitscope.run(backbone, dataset, analyses, batch_size=4, device="cpu", progress=False,
                     checkpoint=Checkpoint(state, key, stop_after=2))
    backbone, dataset, analyses, _ = _setup(coco)
    other_key = dict(key, batch_size=8)
    messages: list[str] = []
    cp = Checkpoint(state, other_key, log=messages.append)
    results = vitscope.run(backbone, dataset, analyses, batch_size=8, device="cpu", progress=False, checkpoint=cp)
    assert results.num_images == 22  # counted from scratch: nothing merged from the 8 saved images
    assert any("different run" in m and "batch_size" in m for m in messages), messages


def test_unreadable_state_file_is_ignored(coco, tmp_path):
    backbone, dataset, analyses, key = _setup(coco)
    state = tmp_path / "state.pt"
    state.write_bytes(b"not a torch file")
    messages: list[str] = []
    results = vitscope.run(backbone, dataset, analyses, batch_size=8, device="cpu", progress=False,
                           checkpoint=Checkpoint(state, key, log=messages.append))
    assert results.num_images == 22 and any("unreadable" in m for m in messages)


def test_codec_round_trips_every_kind_of_state():
    store = RowStore(spill_bytes=64)  # tiny: forces rows to disk shards
    for i in range(3):
        store.append({"x": np.full((2, 3), i, dtype=np.float32), "index": np.array([2 * i, 2 * i + 1])})
    from vitscope.analyses.attention.base import AttentionGeometry

    value = {"t": torch.arange(4.0), "a": np.arange(6, dtype=np.int16).reshape(2, 3), 3: {"s": {1, 2}},
             "geometry": AttentionGeometry((0, 1), 4, (8, 8), 1, True), "tuple": (1, "x", None),
             "scalar": np.float64(2.5), "store": store, "dtype": torch.float64}
    out = decode(torch.load(_save(encode(value)), weights_only=True))
    assert torch.equal(out["t"], value["t"]) and out["a"].dtype == np.int16 and (out["a"] == value["a"]).all()
    assert out[3] == {"s": {1, 2}} and out["geometry"] == value["geometry"] and out["tuple"] == (1, "x", None)
    assert out["scalar"] == 2.5 and out["dtype"] is torch.float64
    assert out["store"].rows == 6 and (out["store"].column("x") == store.column("x")).all()


def test_codec_refuses_foreign_objects():
    with pytest.raises(StateCodecError):
        encode({"f": lambda x: x})
    with pytest.raises(StateCodecError):
        decode({"__vs__": "object", "class": "os:system", "state": {"__vs__": "dict", "items": []}})


def _save(tree):
    import io

    buf = io.BytesIO()
    torch.save(tree, buf)
    buf.seek(0)
    return buf


def test_a_state_saved_before_an_analysis_kept_more_is_ignored_not_a_crash(tmp_path, monkeypatch):
    """A state file from a vitscope whose analysis declared fewer states (no image_names yet) starts over."""
    from vitscope.analyses.attention.maps import CLSAttentionMaps
    from vitscope.engine.state import Checkpoint

    old = CLSAttentionMaps()
    full = old.state_dict()
    monkeypatch.setattr(CLSAttentionMaps, "state_dict",
                        lambda self: {k: v for k, v in full.items() if k != "image_names"})
    Checkpoint(tmp_path / "state.pt", key={"run": 1}).save([old], position=4, seen=4, skipped=[])
    monkeypatch.undo()
    said: list[str] = []
    fresh = CLSAttentionMaps()
    assert Checkpoint(tmp_path / "state.pt", key={"run": 1}, log=said.append).restore([fresh]) is None
    assert "does not fit these analyses" in said[-1] and "starting over" in said[-1]
    assert fresh.num_images == 0 and fresh.image_names == {}
