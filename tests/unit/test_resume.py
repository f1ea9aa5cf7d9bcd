"""Resumable runs: an interrupted run continued from its saved state equals an uninterrupted one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import vitscope
from vitscope.analyses.registry import default_analyses
from vitscope.cache.rowstore import RowStore
from vitscope.data.open import as_source
from vitscope.data.synthetic.write import synthesize
from vitscope.engine.provenance import data_fingerprint
from vitscope.engine.state import Checkpoint, run_key
from vitscope.engine.state_codec import StateCodecError, decode, encode
from vitscope.models.digest import model_fingerprint


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return synthesize(tmp_path_factory.mktemp("coco"), "coco", n=22, size=64, seed=3)


def _setup(coco, batch_size=4):
    backbone = vitscope.load_model("tiny-vit")
    dataset = as_source(f"{coco}::coco")
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
             "geometry": AttentionGeometry((0, 1), 4, 1, True), "tuple": (1, "x", None),
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


def test_rows_on_disk_are_linked_beside_the_state_file_and_nothing_leaks(coco, tmp_path, monkeypatch):
    """Every waiting CKA piece on disk: a stopped run's state names one rows folder beside it, the resumed run
    (another batch size) gives the numbers of an uninterrupted one, and spilled rows stay beside the state
    file, their files deleted once their minibatch completes."""
    import vitscope.analyses.representation.hsic as hsic
    from vitscope.analyses.representation.cka import BlockCKA
    from vitscope.analyses.representation.residual import ResidualCKA
    from vitscope.engine.state import STOP_AFTER_ENV

    monkeypatch.setattr(hsic, "_PIECE_IN_MEMORY", 0)  # every piece of every minibatch goes to disk
    backbone = vitscope.load_model("tiny-vit")

    def analyses():
        return [BlockCKA(batch=8), ResidualCKA(batch=8)]

    want = vitscope.run(backbone, f"{coco}::coco", analyses(), batch_size=22, progress=False)
    state = tmp_path / "state.pt"
    monkeypatch.setenv(STOP_AFTER_ENV, "3")
    stopped = analyses()
    with pytest.raises(KeyboardInterrupt):
        vitscope.run(backbone, f"{coco}::coco", stopped, batch_size=3, progress=False, resume=state)
    saved = sorted(tmp_path.glob("state.pt.rows-*"))
    assert len(saved) == 1 and any(saved[0].rglob("*.bin"))  # images 8, 9 wait for minibatch 1 (8..15)
    monkeypatch.delenv(STOP_AFTER_ENV)
    final = analyses()
    got = vitscope.run(backbone, f"{coco}::coco", final, batch_size=5, progress=False, resume=state)
    assert got.resumed_images == 9
    for name in want:
        for key, value in want[name].tensors.items():
            torch.testing.assert_close(got[name].tensors[key], value, rtol=1e-5, atol=1e-7, msg=(name, key))
    assert len(list(tmp_path.glob("state.pt.rows-*"))) == 1  # the final save replaced the stopped run's folder
    spilled = [p for p in tmp_path.glob(".vitscope-rows-*")]
    assert len(spilled) == 1  # this process's rows lived beside the state file, not in /tmp
    shards = [p for p in spilled[0].iterdir() if p.name.startswith("shard-")]
    def pieces(chosen):
        return [piece for a in chosen for w in a.state.open.values() for rows in w.rows for piece in rows]

    assert all(list(a.state.open) == [2] for a in final) and all(list(a.state.open) == [1] for a in stopped)
    # only the pieces still waiting remain: the last minibatch's (16..21), and image 8's of the stopped run
    # (in this process; a stopped process's go when it exits)
    assert len(shards) == len(pieces(final)) + len(pieces(stopped)) and pieces(final)


def test_saving_a_state_writes_nothing_into_the_live_store(tmp_path):
    """A state save links a store's files into the rows folder; the store's own folder gains nothing."""
    from vitscope.engine.state import Checkpoint

    class Rows(vitscope.Analysis):
        def __init__(self) -> None:
            super().__init__()
            self.add_state("rows", RowStore, reduce="cat")

        def required_hooks(self, spec):
            return []

        def update(self, record, batch):
            pass

        def compute(self):
            return {}

    a = Rows()
    a.rows = RowStore(spill_bytes=64)
    a.rows.append({"x": np.zeros((4, 8), dtype=np.float32)})  # 128 bytes: spilled to a shard
    a.rows.append({"x": np.ones((1, 8), dtype=np.float32)})  # 32 bytes: kept in memory
    folder = Path(a.rows.workdir)
    before = sorted(folder.iterdir())
    checkpoint = Checkpoint(tmp_path / "s.pt", {"k": 1})
    for _ in range(3):
        checkpoint.save([a], 5, 5, [])
    assert sorted(folder.iterdir()) == before
    assert len(list(tmp_path.glob("s.pt.rows-*"))) == 1
    twin = Rows()
    assert Checkpoint(tmp_path / "s.pt", {"k": 1}).restore([twin]) is not None
    np.testing.assert_array_equal(twin.rows.column("x"), a.rows.column("x"))


def _mean_of_last_block(results) -> torch.Tensor:
    return results["mean_activation"].tensors["blocks.1.resid_post.mean"]


def test_a_state_saved_under_a_view_is_not_resumed_by_a_run_without_it(tmp_path, monkeypatch):
    """The view decides the pixels, so it keys the state: a letterboxed run's state is ignored by a plain run."""
    from PIL import Image

    from vitscope.engine.state import STOP_AFTER_ENV
    from vitscope.models.views import LetterboxView, StandardView

    backbone = vitscope.load_model("tiny-vit")
    rng = np.random.default_rng(0)
    data = [Image.fromarray(rng.integers(0, 256, (40, 80, 3), dtype=np.uint8)) for _ in range(12)]  # wide

    def go(view, **kw):
        return vitscope.run(backbone, data, ["mean_activation"], batch_size=4, device="cpu", progress=False,
                            view=view, **kw)

    plain = _mean_of_last_block(go(None))
    assert not torch.equal(_mean_of_last_block(go(LetterboxView())), plain)  # the view changes the numbers
    state = tmp_path / "state.pt"
    monkeypatch.setenv(STOP_AFTER_ENV, "2")
    with pytest.raises(KeyboardInterrupt):
        go(LetterboxView(), resume=state)
    monkeypatch.delenv(STOP_AFTER_ENV)
    said: list[str] = []
    resumed = go(None, resume=state, log=said.append)
    assert resumed.resumed_images == 0 and any("changed: view" in m for m in said), said
    assert torch.equal(_mean_of_last_block(resumed), plain)
    # the standard view is the model's own preprocessing: its state resumes a run without a view
    monkeypatch.setenv(STOP_AFTER_ENV, "2")
    with pytest.raises(KeyboardInterrupt):
        go(StandardView(), resume=tmp_path / "standard.pt")
    monkeypatch.delenv(STOP_AFTER_ENV)
    again = go(None, resume=tmp_path / "standard.pt")
    assert again.resumed_images == 8 and torch.equal(_mean_of_last_block(again), plain)


def test_active_edits_of_a_tiled_backbone_are_the_wrapped_ones():
    backbone = vitscope.load_model("tiny-vit")
    from vitscope.models.tiled import wrap_tiled

    tiled = wrap_tiled(backbone)
    keep = {"blocks.0.resid_post": lambda t, name: t}
    with backbone.intervene(keep):
        assert len(tiled.active_edits) == 1  # the wrapped model's edits run on every tile
    assert tiled.active_edits == () and backbone.active_edits == ()


def test_no_state_is_resumed_or_saved_while_edits_are_installed(coco, tmp_path, monkeypatch):
    """Edit functions cannot be keyed: an edited run neither continues a saved state nor leaves one behind."""
    from vitscope.engine.state import STOP_AFTER_ENV
    from vitscope.interventions import ablate_heads

    backbone = vitscope.load_model("tiny-vit")
    data = f"{coco}::coco"
    edit = ablate_heads({b: list(range(backbone.spec.num_heads)) for b in range(backbone.spec.num_blocks)},
                        mode="zero")

    def go(**kw):
        return vitscope.run(backbone, data, ["mean_activation"], batch_size=4, device="cpu", progress=False, **kw)

    clean = _mean_of_last_block(go())
    with backbone.intervene(edit):
        ablated = _mean_of_last_block(go())
    assert not torch.allclose(ablated, clean)
    state = tmp_path / "state.pt"
    said: list[str] = []
    monkeypatch.setenv(STOP_AFTER_ENV, "2")
    with backbone.intervene(edit):
        try:
            edited = go(resume=state, log=said.append)  # no checkpoint: nothing stops it, nothing is saved
        except KeyboardInterrupt:
            pytest.fail("the edited run kept a resumable state (it stopped to save one)")
    assert not state.exists() and edited.resumed_images == 0 and torch.equal(_mean_of_last_block(edited), ablated)
    assert any("not resuming" in m and "backbone.intervene" in m for m in said), said
    with pytest.raises(KeyboardInterrupt):
        go(resume=state)  # a clean run stopped with its state saved
    monkeypatch.delenv(STOP_AFTER_ENV)
    with backbone.intervene(edit):
        edited = go(resume=state)
    assert edited.resumed_images == 0 and torch.equal(_mean_of_last_block(edited), ablated)
    finished = go(resume=state)  # the clean state was left as it was
    assert finished.resumed_images == 8 and torch.equal(_mean_of_last_block(finished), clean)


_SCALED_NORM = '''
import torch
import vitscope


class ScaledNorm(vitscope.Analysis):
    name = "scaled_norm"

    def __init__(self):
        super().__init__()
        self.add_state("total", torch.zeros((), dtype=torch.float64), reduce="sum")

    def required_hooks(self, spec):
        return ["blocks.0.resid_post"]

    def update(self, record, batch):
        self.total += record["blocks.0.resid_post"].double().norm(dim=-1).sum() * SCALE

    def compute(self):
        return {"total": self.total}
'''


def _plugin(folder: Path, scale: float, monkeypatch):
    """A fresh import of ``scaled_norm_plugin.py`` written with ``SCALE = scale`` (as a new process would)."""
    import importlib.util
    import sys

    file = folder / "scaled_norm_plugin.py"
    file.write_text(f"SCALE = {scale}\n{_SCALED_NORM}")
    spec = importlib.util.spec_from_file_location("scaled_norm_plugin", file)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "scaled_norm_plugin", module)  # as an import does (--import too)
    spec.loader.exec_module(module)
    return module.ScaledNorm()


def test_a_plugin_edited_between_a_stop_and_its_resume_starts_over(coco, tmp_path, monkeypatch):
    """The file of an analysis from outside vitscope keys the state, as results.json names its digest."""
    from vitscope.engine.state import STOP_AFTER_ENV

    backbone = vitscope.load_model("tiny-vit")
    data = f"{coco}::coco"

    def go(analysis, **kw):
        return vitscope.run(backbone, data, [analysis], batch_size=4, device="cpu", progress=False, **kw)

    state = tmp_path / "state.pt"
    monkeypatch.setenv(STOP_AFTER_ENV, "2")
    with pytest.raises(KeyboardInterrupt):
        go(_plugin(tmp_path, 1.0, monkeypatch), resume=state)
    monkeypatch.delenv(STOP_AFTER_ENV)
    want = go(_plugin(tmp_path, 1000.0, monkeypatch))["scaled_norm"].tensors["total"]
    said: list[str] = []
    got = go(_plugin(tmp_path, 1000.0, monkeypatch), resume=state, log=said.append)  # the file changed
    assert got.resumed_images == 0 and any("changed: sources" in m for m in said), said
    assert torch.equal(got["scaled_norm"].tensors["total"], want)
    monkeypatch.setenv(STOP_AFTER_ENV, "2")
    with pytest.raises(KeyboardInterrupt):
        go(_plugin(tmp_path, 1000.0, monkeypatch), resume=tmp_path / "same.pt")
    monkeypatch.delenv(STOP_AFTER_ENV)
    again = go(_plugin(tmp_path, 1000.0, monkeypatch), resume=tmp_path / "same.pt")  # the same file: resumed
    assert again.resumed_images == 8
    torch.testing.assert_close(again["scaled_norm"].tensors["total"], want, rtol=1e-12, atol=0)


def test_a_run_with_another_number_of_processes_says_it_starts_over_one_process_included(tmp_path):
    """The state of one process and the per-rank files of several do not apply to each other: both directions
    say so (going from 2 processes to 1, or from 1 to 2, started over without a word)."""
    from vitscope.engine.state import Checkpoint

    said: list[str] = []
    (tmp_path / "run.rank0-of-2.pt").write_bytes(b"x")
    one = Checkpoint(tmp_path / "run.pt", {"k": 1}, log=said.append)
    one.for_rank(0, 1)
    assert one.path == tmp_path / "run.pt" and one.key == {"k": 1}  # one process keeps its name and key
    assert said == ["ignoring saved state of a run with 2 processes (this one has 1); starting over"]
    said.clear()
    (tmp_path / "run.rank0-of-2.pt").unlink()
    (tmp_path / "run.pt").write_bytes(b"x")
    two = Checkpoint(tmp_path / "run.pt", {"k": 1}, log=said.append)
    two.for_rank(0, 2)
    assert two.path == tmp_path / "run.rank0-of-2.pt"
    assert said == ["ignoring saved state of a run with 1 processes (this one has 2); starting over"]
    quiet = Checkpoint(tmp_path / "run.pt", {"k": 1}, log=said.append)
    quiet.for_rank(1, 2)  # only rank 0 speaks
    assert len(said) == 1
