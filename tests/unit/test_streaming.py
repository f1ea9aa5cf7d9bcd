"""Tensors reduced as the model makes them: the record keeps shapes only, one block's pattern is alive at a time,
analyses that read patterns whole still get them, and the chunked kernels give the same numbers."""

from __future__ import annotations

import importlib

import pytest
import torch

import vitscope
from helpers.images import random_pngs
from vitscope.analyses import AttentionStats
from vitscope.analyses.base import Analysis
from vitscope.analyses.batch import ATTENTION_BLOCKS, Batch, SharedQuantities
from vitscope.analyses.registry import default_analyses
from vitscope.engine.memory import pattern_fit
from vitscope.functional import image_groups
from vitscope.functional.attention_blocks import QUANTITIES, Workspace, block_statistics
from vitscope.hooks.record import Record

interrelation = importlib.import_module("vitscope.functional.interrelation")  # the package exports a function too


@pytest.fixture(scope="module")
def tiny():
    return vitscope.load_model("tiny-vit")


@pytest.fixture
def photos(tmp_path):
    return str(random_pngs(tmp_path, [(40, 48)] * 5, seed=1, prefix="p"))


class Spy(Analysis):
    """Notes what its update sees of the patterns; reads them whole when asked to."""

    def __init__(self, whole: bool = False) -> None:
        super().__init__()
        self.whole = whole
        self.add_state("seen", 0, reduce="sum")
        self.meta_seen: list[bool] = []
        self.sums: list[float] = []

    def required_hooks(self, spec):
        return ["blocks.*.attn.pattern"]

    def record_reads(self, spec):
        return self.required_hooks(spec) if self.whole else []

    def update(self, record, batch):
        pattern = record["blocks.1.attn.pattern"]
        self.meta_seen.append(pattern.is_meta)
        if not pattern.is_meta:
            self.sums.append(float(pattern.sum()))
        self.seen += batch.size

    def compute(self):
        return {"seen": self.seen}


def test_record_keeps_only_shapes_of_reduced_tensors():
    rec = Record(["a", "b", "c"])
    got = []
    with rec.reducing(frozenset({"a", "b"}), lambda name, t: got.append((name, float(t.sum()))), keep={"b"}):
        rec.put("a", torch.ones(2, 3))
        rec.put("b", torch.ones(4))
        rec.put("c", torch.ones(1))
    assert got == [("a", 6.0), ("b", 4.0)]
    assert rec["a"].is_meta and rec["a"].shape == (2, 3)
    assert not rec["b"].is_meta and not rec["c"].is_meta
    rec.put("a", torch.ones(1))  # outside the context nothing is reduced
    assert not rec["a"].is_meta


def test_default_analyses_stream_every_pattern_and_one_is_alive_at_a_time(tiny, photos, monkeypatch):
    spy = Spy()
    analyses = default_analyses(tiny.spec, set()) + [spy]
    alive: list[int] = []
    original = Record.put

    def put(self, name, tensor):
        original(self, name, tensor)
        alive.append(sum(1 for k, v in self._data.items() if k.endswith("attn.pattern") and not v.is_meta))

    monkeypatch.setattr(Record, "put", put)
    res = vitscope.run(tiny, photos, analyses, batch_size=2, progress=False)
    assert res.num_images == 5 and spy.meta_seen == [True, True, True]
    assert max(alive) == 0  # nothing in the record holds a pattern's values once it is recorded


def test_an_analysis_that_reads_patterns_whole_still_gets_them(tiny, photos):
    whole, streamed = Spy(whole=True), Spy()
    whole.name, streamed.name = "whole", "streamed"
    vitscope.run(tiny, photos, [whole, streamed, AttentionStats()], batch_size=5, progress=False)
    assert whole.meta_seen == [False] and streamed.meta_seen == [False]  # kept for the whole batch
    with torch.inference_mode(), tiny.record("blocks.1.attn.pattern") as rec:
        from vitscope.data.files import ImageFiles

        files = ImageFiles(photos)
        tiny(tiny.preprocess([files.get(i).image for i in range(len(files))]))
        assert whole.sums[0] == pytest.approx(float(rec["blocks.1.attn.pattern"].sum()), rel=1e-6)


def test_asking_for_more_than_the_plan_after_streaming_says_what_to_do(tiny):
    batch = Batch(pixels=torch.zeros(1, 3, 32, 32), indices=[0], paths=["x"], spec=tiny.spec, grid=(2, 2))
    record = {"blocks.0.attn.pattern": torch.empty(1, 3, 5, 5, device="meta")}
    batch.shared = SharedQuantities(record, {ATTENTION_BLOCKS: frozenset({"cls"})})
    with pytest.raises(RuntimeError, match="record_reads|shared_quantities"):
        batch.quantity(ATTENTION_BLOCKS, record, {"entropy"})


def _pattern(b, h, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(b, h, n, n, generator=g).softmax(dim=-1)


def test_block_statistics_in_groups_of_images_equal_the_whole_batch(monkeypatch):
    pattern = _pattern(5, 2, 1 + 9)
    needs = QUANTITIES
    whole = block_statistics(pattern, (3, 3), 1, needs, Workspace())
    monkeypatch.setattr(image_groups, "GROUP_BYTES", pattern[:2].numel() * 4)  # two images at a time
    grouped = block_statistics(pattern, (3, 3), 1, needs, Workspace())
    for name in ("cls", "colsum", "rowsum", "entropy", "focus", "peak"):
        torch.testing.assert_close(getattr(grouped, name), getattr(whole, name), rtol=0, atol=0)
    # aligned sums the groups in float64 instead of all images in float32: float32 rounding apart
    torch.testing.assert_close(grouped.aligned, whole.aligned, rtol=1e-6, atol=1e-7)
    for mode in whole.fused:
        torch.testing.assert_close(grouped.fused[mode], whole.fused[mode], rtol=0, atol=0)
    assert grouped.batch_size == 5


def test_interrelation_in_groups_of_images_equals_the_whole_batch(monkeypatch):
    pattern = _pattern(5, 2, 1 + 16, seed=3)
    counts = torch.randint(0, 3, (5, 4, 4), generator=torch.Generator().manual_seed(0))
    whole = interrelation.patch_interrelation(pattern, counts, (4, 4), 1)
    monkeypatch.setattr(image_groups, "GROUP_BYTES", pattern[:1].numel() * 4)  # one image at a time
    grouped = interrelation.patch_interrelation(pattern, counts, (4, 4), 1)
    torch.testing.assert_close(grouped, whole, rtol=0, atol=0, equal_nan=True)


def test_recording_kernel_in_groups_of_images_gives_the_same_patterns(monkeypatch):
    from helpers.hf_factories import make

    backbone = vitscope.wrap(make("vit"))
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode(), backbone.record("blocks.*.attn.pattern") as rec:
        backbone(x)
        whole = {k: v.clone() for k, v in rec.items()}
        monkeypatch.setattr(image_groups, "GROUP_BYTES", 1)  # one image at a time
        backbone(x)
        for k, v in rec.items():
            torch.testing.assert_close(v, whole[k], rtol=0, atol=0)


def test_pattern_fit_suggests_the_batch_that_fits():
    per_image = 6 * 1370 * 1370 * 4 * 2  # one pattern in flight and its work memory
    assert pattern_fit(6, 1370, 16, 0, free=16 * per_image) is None
    message = pattern_fit(6, 1370, 16, 0, free=11 * per_image + 5)
    assert "-b 11" in message and "1370 tokens" in message
    assert "-b 5" in pattern_fit(6, 1370, 16, 2, free=10 * per_image)  # two patterns kept whole: twice per image
    assert "smaller input size" in pattern_fit(6, 1370, 16, 0, free=per_image // 2)
    assert pattern_fit(6, 1370, 16, 0, free=None) is None


def test_every_registered_analysis_streams_its_blocks_but_head_importance():
    """What an analysis reads whole in ``update`` stays alive for every block at once; only head importance, which
    resumes the forward from each block's input after the pass, keeps its blocks (docs/architecture.md)."""
    from vitscope.analyses.registry import ANALYSES, get_analysis

    spec = vitscope.load_model("tiny-vit-sup").spec
    whole = {}
    for name in ANALYSES:
        analysis = get_analysis(name)
        if analysis.why_unsupported(spec) is None:
            whole[name] = [h for h in analysis.record_reads(spec) if "*" in h]
    assert {"knn_probe", "linear_probe", "clustering", "cka", "mean_activation"} <= set(whole)
    assert {name for name, reads in whole.items() if reads} == {"head_importance"}, whole
