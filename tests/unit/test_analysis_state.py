"""Declared analysis state: every merge rule against hand-computed values, and the base class around it."""

from __future__ import annotations

import functools
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vitscope.analyses.base import Analysis
from vitscope.analyses.state import StateMergeError, StateSpec, first_seen, merge_states
from vitscope.cache.rowstore import RowStore
from vitscope.functional.moments import merge_moments
from vitscope.functional.topk import merge_topk


def _merge(spec: StateSpec, a, b, **companions):
    specs = {spec.name: spec, **{n: StateSpec(n, None, "sum") for n in companions}}
    mine = {spec.name: a, **{n: v[0] for n, v in companions.items()}}
    theirs = {spec.name: b, **{n: v[1] for n, v in companions.items()}}
    return merge_states(specs, mine, theirs)


def test_sum_max_min_by_hand() -> None:
    a, b = torch.tensor([1.0, 5.0]), torch.tensor([3.0, 2.0])
    assert _merge(StateSpec("x", None, "sum"), a, b)["x"].tolist() == [4.0, 7.0]
    assert _merge(StateSpec("x", None, "max"), a, b)["x"].tolist() == [3.0, 5.0]
    assert _merge(StateSpec("x", None, "min"), a, b)["x"].tolist() == [1.0, 2.0]
    assert _merge(StateSpec("n", 0, "sum"), 2, 5)["n"] == 7
    assert _merge(StateSpec("n", 0, "max"), 2, 5)["n"] == 5


def test_none_is_nothing_yet_and_the_other_side_is_copied() -> None:
    b = torch.tensor([3.0])
    merged = _merge(StateSpec("x", None, "sum"), None, b)["x"]
    assert merged.tolist() == [3.0] and merged is not b
    merged += 1
    assert b.tolist() == [3.0]  # adopting a value never aliases the other side's tensor
    assert _merge(StateSpec("x", None, "sum"), b, None)["x"] is b


def test_mean_is_count_weighted() -> None:
    # 2 examples with mean 1 and 6 with mean 3: (2 * 1 + 6 * 3) / 8 = 2.5
    merged = _merge(StateSpec("m", None, "mean", count="n"), torch.tensor([1.0]), torch.tensor([3.0]), n=(2.0, 6.0))
    assert merged["m"].tolist() == [2.5] and merged["n"] == 8.0


def test_variance_follows_chan_and_equals_the_direct_computation() -> None:
    x = torch.tensor([1.0, 2.0, 4.0, 7.0, 11.0], dtype=torch.float64)
    a, b = x[:2], x[2:]
    specs = {"n": StateSpec("n", 0.0, "sum"), "mean": StateSpec("mean", None, "mean", count="n"),
             "m2": StateSpec("m2", None, "variance", mean="mean", count="n")}

    def state(v):
        return {"n": float(v.numel()), "mean": v.mean(), "m2": ((v - v.mean()) ** 2).sum()}

    merged = merge_states(specs, state(a), state(b))
    assert merged["n"] == 5.0
    torch.testing.assert_close(merged["mean"], x.mean())
    torch.testing.assert_close(merged["m2"], ((x - x.mean()) ** 2).sum())  # by hand: mean 5, 16 + 9 + 1 + 4 + 36
    assert float(merged["m2"]) == pytest.approx(66.0)


def test_dicts_merge_key_by_key_with_their_companions() -> None:
    specs = {"n": StateSpec("n", {}, "sum"), "mean": StateSpec("mean", {}, "mean", count="n")}
    mine = {"n": {"a": 1.0}, "mean": {"a": torch.tensor(2.0)}}
    theirs = {"n": {"a": 3.0, "b": 2.0}, "mean": {"a": torch.tensor(6.0), "b": torch.tensor(-1.0)}}
    merged = merge_states(specs, mine, theirs)
    assert merged["n"] == {"a": 4.0, "b": 2.0}
    assert float(merged["mean"]["a"]) == 5.0 and float(merged["mean"]["b"]) == -1.0  # (2 + 18) / 4


def test_cat_lists_and_row_stores() -> None:
    assert _merge(StateSpec("x", [], "cat"), [1, 2], [3])["x"] == [1, 2, 3]
    a, b = RowStore(), RowStore(spill_bytes=1)  # b spills to disk: its shard is shared, not copied
    a.append({"v": np.array([1.0, 2.0])})
    b.append({"v": np.array([3.0])})
    merged = _merge(StateSpec("s", functools.partial(RowStore), "cat"), a, b)["s"]
    assert sorted(merged.column("v").tolist()) == [1.0, 2.0, 3.0] and len(b) == 1


def test_topk_keeps_the_best_with_ties_to_the_smaller_index() -> None:
    spec = StateSpec("t", {}, "topk", key="score", tie="index", k=3, dim=0)
    a = {"score": torch.tensor([5.0, 1.0]), "index": torch.tensor([4, 0]), "map": torch.tensor([[4.0], [0.0]])}
    b = {"score": torch.tensor([5.0, 2.0, 0.5]), "index": torch.tensor([2, 7, 9]),
         "map": torch.tensor([[2.0], [7.0], [9.0]])}
    merged = _merge(spec, a, b)["t"]
    assert merged["index"].tolist() == [2, 4, 7]  # 5 (index 2 before 4), then 2.0
    assert merged["map"].flatten().tolist() == [2.0, 4.0, 7.0]
    nested = _merge(spec, {"hook": a}, {"hook": b, "other": a})["t"]  # per-hook dicts hold topk leaves
    assert nested["hook"]["index"].tolist() == [2, 4, 7] and nested["other"]["index"].tolist() == [4, 0]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 3), st.integers(0, 50)), min_size=1, max_size=20, unique_by=lambda t: t[1]),
       st.integers(0, 20), st.integers(1, 5))
def test_topk_of_a_union_is_the_topk_of_the_parts(items, cut, k) -> None:
    score = torch.tensor([float(s) for s, _ in items])
    index = torch.tensor([i for _, i in items])
    whole = merge_topk({"score": score, "index": index}, k, "score", "index")
    spec = StateSpec("t", {}, "topk", key="score", tie="index", k=k, dim=0)
    parts = [merge_topk({"score": score[sl], "index": index[sl]}, k, "score", "index")
             for sl in (slice(0, cut), slice(cut, None))]
    merged = _merge(spec, *parts)["t"]
    assert merged["index"].tolist() == whole["index"].tolist()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=2, max_size=30), st.integers(1, 29))
def test_chan_merge_of_any_split_equals_one_pass(values, cut) -> None:
    x = torch.tensor(values, dtype=torch.float64)
    cut = min(cut, x.numel() - 1)
    a, b = x[:cut], x[cut:]
    mean, m2 = merge_moments(float(a.numel()), a.mean(), ((a - a.mean()) ** 2).sum(), float(b.numel()), b.mean(),
                             ((b - b.mean()) ** 2).sum())
    torch.testing.assert_close(mean, x.mean(), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(m2, ((x - x.mean()) ** 2).sum(), rtol=1e-9, atol=1e-6)


def test_same_takes_the_filled_side_and_refuses_a_difference() -> None:
    spec = StateSpec("blocks", [], "same")
    assert _merge(spec, [], [0, 1])["blocks"] == [0, 1]
    assert _merge(spec, [0, 1], [0, 1])["blocks"] == [0, 1]
    with pytest.raises(StateMergeError, match="blocks"):
        _merge(spec, [0, 1], [0, 2])


def test_a_same_dict_merges_key_by_key_and_refuses_a_difference_at_a_shared_key() -> None:
    """frequency_filtering keeps radii per input size: two processes that saw different sizes hold the union."""
    spec = StateSpec("radii", {}, "same")
    merged = _merge(spec, {"32x64": [1.0, 2.0]}, {"64x32": [1.0, 3.0], "32x64": [1.0, 2.0]})["radii"]
    assert merged == {"32x64": [1.0, 2.0], "64x32": [1.0, 3.0]}
    with pytest.raises(StateMergeError, match="32x64"):
        _merge(spec, {"32x64": [1.0, 2.0]}, {"32x64": [1.0, 2.5]})


def test_callable_reduce_and_first_seen() -> None:
    merged = _merge(StateSpec("chosen", {}, first_seen), {1: "a"}, {1: "b", 2: "c"})["chosen"]
    assert merged == {1: "a", 2: "c"}
    assert _merge(StateSpec("x", None, lambda a, b: a * b), 3, 4)["x"] == 12


def test_shapes_that_differ_are_a_clear_error() -> None:
    with pytest.raises(StateMergeError, match=r"shape \(3,\) cannot merge into one of shape \(2,\)"):
        _merge(StateSpec("x", None, "sum"), torch.zeros(2), torch.zeros(3))


@pytest.mark.parametrize(("options", "message"), [
    ({"reduce": "avg"}, "reduce must be one of"),
    ({"reduce": "mean"}, "needs count="),
    ({"reduce": "variance", "count": "n"}, "needs mean="),
    ({"reduce": "topk", "key": "s"}, "k >= 1"),
])
def test_bad_declarations_are_refused(options, message) -> None:
    with pytest.raises(ValueError, match=message):
        StateSpec("x", None, **options)


class Counter(Analysis):
    """A small analysis using the base class alone."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = scale
        self.add_state("total", torch.zeros((), dtype=torch.float64), reduce="sum")
        self.add_state("peak", None, reduce="max")
        self.add_state("seen", [], reduce="cat")

    def required_hooks(self, spec):
        return ["blocks.0.resid_post"]

    def update(self, record, batch):
        x = record["x"].double() * self.scale
        self.total += x.sum()
        self.peak = x.max() if self.peak is None else torch.maximum(self.peak, x.max())
        self.seen = self.seen + batch

    def compute(self):
        return {"total": self.total, "peak": self.peak, "seen": sorted(self.seen)}


def _fed(values: list[float], indices: list[int], scale: float = 1.0) -> Counter:
    c = Counter(scale=scale)
    c.update({"x": torch.tensor(values)}, indices)
    return c


def test_base_class_merges_resets_saves_and_loads() -> None:
    a, b = _fed([1.0, 4.0], [0, 1]), _fed([2.0], [2])
    assert a.state_names == ("total", "peak", "seen") and a.params == {"scale": 1.0}
    merged = a.merge(b)
    assert merged is a and float(a.total) == 7.0 and float(a.peak) == 4.0 and a.seen == [0, 1, 2]
    assert float(b.total) == 2.0 and b.seen == [2]  # the argument is unchanged
    twin = Counter()
    twin.load_state_dict(pickle.loads(pickle.dumps(a.state_dict())))
    assert twin.compute()["seen"] == [0, 1, 2] and float(twin.total) == 7.0
    fresh = a.fresh()
    assert float(fresh.total) == 0.0 and fresh.peak is None and fresh.seen == [] and fresh.scale == 1.0
    a.reset()
    assert float(a.total) == 0.0 and a.seen == []
    with pytest.raises(KeyError, match="lacks peak"):
        twin.load_state_dict({"total": torch.zeros(()), "seen": []})


def test_merge_refuses_another_configuration_or_class() -> None:
    with pytest.raises(ValueError, match="configured"):
        _fed([1.0], [0]).merge(_fed([1.0], [1], scale=2.0))
    with pytest.raises(TypeError):
        _fed([1.0], [0]).merge(object())  # type: ignore[arg-type]


def test_add_state_refuses_bad_names_and_a_missing_super_init() -> None:
    c = Counter()
    for name in ("total", "_private", "update", "not an identifier"):
        with pytest.raises(ValueError, match="cannot declare"):
            c.add_state(name, 0)

    class Forgot(Counter):
        def __init__(self) -> None:  # no super().__init__(): the params wrapper still prepares the state table
            self.add_state("n", 0)

    assert Forgot().n == 0


class Moments(Analysis):
    """States for every path of sync: all_reduce (sum, min, one side empty) and gathered (a mean, its counts)."""

    def __init__(self) -> None:
        super().__init__()
        self.add_state("n", 0, reduce="sum")  # a mean's counts: merged with the mean, not all_reduced alone
        self.add_state("mean", None, reduce="mean", count="n")
        self.add_state("low", None, reduce="min")
        self.add_state("hits", None, reduce="sum")

    def required_hooks(self, spec):
        return []

    def update(self, record, batch):
        x = record["x"].double()
        self.mean = x.mean(0) if self.mean is None else (self.mean * self.n + x.sum(0)) / (self.n + len(x))
        self.n += len(x)
        self.low = x.amin(0) if self.low is None else torch.minimum(self.low, x.amin(0))
        if batch:  # only some processes see hits: the others hold None
            self.hits = torch.tensor(batch, dtype=torch.int64) if self.hits is None else self.hits + torch.tensor(batch)

    def compute(self):
        return {}


MOMENT_DATA = [(torch.tensor([[1.0, 5.0], [3.0, -1.0]]), []), (torch.tensor([[2.0, 0.0], [8.0, 4.0], [5.0, 2.0]]),
                                                                 [4, 7])]


def _moments(rank: int) -> Moments:
    m = Moments()
    x, hits = MOMENT_DATA[rank]
    m.update({"x": x}, hits)
    return m


def _sync_worker(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        values = [[1.0, 4.0], [2.0, 9.0, -3.0]][rank]
        counter = _fed(values, [[0, 1], [2, 3, 4]][rank])
        counter.sync()
        moments = _moments(rank)
        moments.sync()
        torch.save({"total": counter.total, "peak": counter.peak, "seen": counter.seen,
                    "moments": moments.state_dict()}, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_sync_gives_every_process_the_state_of_the_whole_group(tmp_path) -> None:
    from helpers.processes import run_gloo

    run_gloo(_sync_worker, str(tmp_path))
    whole = _fed([1.0, 4.0, 2.0, 9.0, -3.0], [0, 1, 2, 3, 4])
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert float(got["total"]) == float(whole.total) == 13.0 and float(got["peak"]) == 9.0
        assert sorted(got["seen"]) == [0, 1, 2, 3, 4]
        want = _moments(0).merge(_moments(1)).state_dict()
        assert got["moments"]["n"] == want["n"] == 5
        for key in ("mean", "low", "hits"):
            assert torch.equal(got["moments"][key], want[key]), key
        assert got["moments"]["hits"].tolist() == [4, 7]  # rank 0 held None: the sum's identity stood in
    alone = _fed([1.0], [0])
    alone.sync()  # no process group: a no-op
    assert float(alone.total) == 1.0
