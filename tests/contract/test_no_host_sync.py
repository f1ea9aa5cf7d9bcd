"""No analysis makes the GPU wait in the hot loop: ``update``, ``update_hook`` and ``end_batch`` of every registered
analysis never copy a tensor to the host nor read its values there.

On a GPU each such call stops the host until the device has caught up, batch after batch (43 copies per batch of the
attention suite once measured on an H100, benchmarks/README.md). On the CPU the same calls cost nothing, so this
test watches for the calls themselves during a real pass (the engine, the tiny zoo, a synthetic COCO world, three
batches): ``.cpu()``, ``.numpy()``, ``.tolist()``, ``.item()``, ``.to("cpu")`` (written so), ``np.asarray(tensor)``,
a tensor's truth value or number (``aten._local_scalar_dense``: ``if t.any()``, ``int(t)``, ``float(t)``), and the
operations whose output size depends on the values (``nonzero``, ``masked_select``, ``unique``, indexing with a
boolean mask), which wait too. Host copies belong in ``compute()``, checkpoints and row stores (rows go to disk);
ground truth made by the loader is host data and is read as numpy. Work done by a shared quantity counts for the
analysis that asks for it first. Row stores may take rows in the hot loop: they queue asynchronous copies into pinned
host buffers (``vitscope.cache.host_copy``, the one module exempted here).

The analyses not yet moved to the device are listed in ``HOST_BOUND`` with what remains; the test is strict about
them too (it fails when one of them becomes clean, so that the list only shrinks).
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import traceback
from collections.abc import Iterator
from unittest import mock

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import vitscope
from helpers.doc_examples import doc_analyses, registered
from vitscope.analyses import ANALYSES
from vitscope.analyses.base import Batch
from vitscope.cache import host_copy
from vitscope.data.synthetic.write import synthesize

try:  # pytest's default "prepend" import mode puts this folder on sys.path
    from fake_records import construct
except ImportError:  # pragma: no cover - when tests/ is a package
    from tests.contract.fake_records import construct

#: analyses that still copy to the host in the hot loop, and what does it
HOST_BOUND: dict[str, str] = {
}

_WATCHED_OPS = {
    torch.ops.aten._local_scalar_dense.default: "a tensor's value read on the host (bool, int, float, item)",
    torch.ops.aten.nonzero.default: "nonzero (output size depends on the values)",
    torch.ops.aten.masked_select.default: "masked_select (output size depends on the values)",
}
_UNIQUE = ("_unique2", "unique_dim", "unique_consecutive", "_unique")
#: Python's reads of a tensor's value: under inference mode (the engine's) they skip the dispatch mode
_VALUE_READS = ("__bool__", "__float__", "__int__", "__index__")

_current: contextvars.ContextVar[str | None] = contextvars.ContextVar("analysis", default=None)
_batch: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("batch", default=None)
_hits: collections.Counter = collections.Counter()


def _where(skip: str = "/engine/") -> str:
    """The innermost vitscope line of the stack outside the engine (and ``skip``) and this test."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if "/vitscope/" in frame.filename and "/engine/" not in frame.filename and skip not in frame.filename:
            return f"{frame.filename.split('/vitscope/')[-1]}:{frame.lineno}"
    return "?"


#: the one module allowed to touch host memory in the hot loop: it queues copies into pinned buffers and reads
#: nothing before their events say the copies have finished (its own tests check that)
_ASYNC_COPIES = "cache/host_copy.py:"


def _note(what: str) -> None:
    name = _current.get()
    if name is not None:
        where = _where()
        if not where.startswith(_ASYNC_COPIES):
            _hits[(name, what, where)] += 1


class _Watch(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _WATCHED_OPS:
            _note(_WATCHED_OPS[func])
        elif func.overloadpacket.__name__ in _UNIQUE:
            _note("unique (output size depends on the values)")
        elif func.overloadpacket is torch.ops.aten.index and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else ())):
            _note("indexing with a boolean mask (output size depends on the values)")
        return func(*args, **kwargs)


@contextlib.contextmanager
def _spied_methods() -> Iterator[None]:
    def spy(name: str, original):
        def method(self, *args, **kwargs):
            if name in _VALUE_READS:
                _note("a tensor's value read on the host (bool, int, float, item)")
            elif name != "to" or any(_is_cpu(a) for a in (*args, kwargs.get("device"))):
                _note(f".{name}()")
            return original(self, *args, **kwargs)
        return method

    names = ("cpu", "numpy", "tolist", "item", "__array__", "to", *_VALUE_READS)
    saved = {n: getattr(torch.Tensor, n) for n in names}
    try:
        for n in names:
            setattr(torch.Tensor, n, spy(n, saved[n]))
        yield
    finally:
        for n in names:
            setattr(torch.Tensor, n, saved[n])


def _is_cpu(value) -> bool:
    """``"cpu"`` written out: on this machine the batches' own device is the CPU too, so ``.to(x.device)`` (moving a
    restored state to where the batch is) looks the same as a copy home; the literal is what says "to the host"."""
    return isinstance(value, str) and value.startswith("cpu")


def _watched(analysis) -> None:
    """Mark every call of the analysis's hot-loop methods as its own, and of those and ``reduce_hook`` as
    belonging to their batch."""
    for method in ("update", "update_hook", "end_batch", "reduce_hook"):
        original = getattr(analysis, method)

        def wrapped(*args, _original=original, _name=analysis.name, _hot=method != "reduce_hook", **kwargs):
            batch = next((a for a in (*args, *kwargs.values()) if isinstance(a, Batch)), None)
            tokens = [_batch.set(None if batch is None else (batch.spec.name, tuple(batch.indices)))]
            if _hot:
                tokens.append(_current.set(_name))
            try:
                return _original(*args, **kwargs)
            finally:
                for var, token in zip((_batch, _current), tokens):
                    var.reset(token)
        setattr(analysis, method, wrapped)


class _CopyEvent:
    """A stand-in for the CUDA event of an asynchronous host copy, unfinished during the batch that queued it:
    waiting for it then (in the hot loop) is the wait the row stores must never make."""

    def __init__(self) -> None:
        self.batch = _batch.get()

    def query(self) -> bool:
        return self.batch is None or self.batch != _batch.get()

    def synchronize(self) -> None:
        name = _current.get()
        if name is not None and not self.query():
            _hits[(name, "waits for a host copy queued in the same batch", _where(skip="/cache/"))] += 1


MODELS = ("tiny-vit-sup", "tiny-resnet-sup")
DOCUMENTED = doc_analyses()


#: parameters that keep the slow analyses quick (their hot loop is the same at any size), or take a path of the hot
#: loop that the defaults would not reach on 12 images
LIGHT = {"head_importance": {"blocks": (5,), "reference_images": 4},
         # minibatches of the CKA estimator (batches of 4): two pieces each (rows waiting, then the completing
         # piece), and whole in one batch
         "cka": {"batch": 8}, "residual_cka": {"batch": 4}}


@pytest.fixture(scope="module")
def hits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """``analysis -> ["what at where (count)"]`` over a pass of every registered analysis on each tiny model."""
    root = synthesize(tmp_path_factory.mktemp("sync") / "world", "coco", n=12, size=64, seed=3)
    _hits.clear()
    seen: set[str] = set()
    with registered(*DOCUMENTED.values()):
        for model in MODELS:
            backbone = vitscope.load_model(model)
            made = [construct(name, backbone.spec, **LIGHT.get(name, {})) for name in sorted(ANALYSES)]
            made = [a for a in made if a.supports(backbone.spec)]
            for a in made:
                _watched(a)
                seen.add(a.name)
            late = mock.patch.object(host_copy, "_copy_event", lambda cuda, device=None: _CopyEvent())
            with _spied_methods(), _Watch(), late:
                vitscope.run(backbone, f"{root}::coco", made, batch_size=4, progress=False, workers=0)
    found: dict[str, list[str]] = {name: [] for name in seen}
    for (name, what, where), count in sorted(_hits.items()):
        found[name].append(f"{what} at {where} ({count}x)")
    return found


def _expected(name: str):
    if name in HOST_BOUND:
        return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=HOST_BOUND[name]))
    return name


@pytest.mark.parametrize("name", [_expected(n) for n in sorted({*ANALYSES, *DOCUMENTED})])
def test_the_hot_loop_never_waits_for_the_device(hits, name: str) -> None:
    assert name in hits, f"{name} did not run on any tiny model"
    assert not hits[name], f"{name} copies to the host or reads values there in its hot loop:\n" + "\n".join(
        hits[name])


def test_the_watch_sees_what_it_looks_for() -> None:
    """Every kind of call the test forbids is noticed (the test can fail), also under inference mode, where the
    engine runs the updates."""
    _hits.clear()
    token = _current.set("probe")
    try:
        with torch.inference_mode(), _spied_methods(), _Watch():
            x = torch.arange(6.0)
            x.cpu(), x.numpy(), x.tolist(), x[0].item(), x.to("cpu"), np.asarray(x)
            bool(x.sum() > 0), float(x.sum()), int(x[0]), x.nonzero(), x[x > 2], torch.unique(x), x.masked_select(x > 1)
            x.to(torch.float64), x.sum(dim=0)  # neither is a host read
    finally:
        _current.reset(token)
    kinds = {what for (_, what, _) in _hits}
    assert {".cpu()", ".numpy()", ".tolist()", ".item()", ".to()", ".__array__()"} <= kinds
    assert {"a tensor's value read on the host (bool, int, float, item)", "nonzero (output size depends on the values)",
            "indexing with a boolean mask (output size depends on the values)",
            "unique (output size depends on the values)", "masked_select (output size depends on the values)"} <= kinds
    assert sum(c for (_, what, _), c in _hits.items() if what == ".to()") == 1  # the dtype change is not counted
    reads = sum(c for (_, what, _), c in _hits.items() if what.startswith("a tensor's value"))
    assert reads >= 3, f"bool, float and int of a tensor: {reads} seen"


def test_the_watch_sees_a_wait_for_a_copy_of_the_same_batch() -> None:
    """Rows a store took in this batch and reads back in this batch make the host wait for the device; rows of an
    earlier batch do not."""
    from vitscope.cache.rowstore import RowStore

    _hits.clear()
    store = RowStore()
    with mock.patch.object(host_copy, "_copy_event", lambda cuda, device=None: _CopyEvent()):
        for batch in ((0, 1), (2, 3)):
            tokens = [_batch.set(("m", batch)), _current.set("probe")]
            try:
                store.append({"x": torch.ones(2, 3)})
                if batch == (2, 3):
                    store.column("x")
            finally:
                _current.reset(tokens[1])
                _batch.reset(tokens[0])
    waits = [k for k in _hits if k[1] == "waits for a host copy queued in the same batch"]
    assert len(waits) == 1 and _hits[waits[0]] == 1, _hits
    assert store.column("x").shape == (4, 3)


def test_the_feature_caches_pass_never_waits_for_the_device(tmp_path) -> None:
    """The feature cache's consumer of the pass (not a registered analysis) hands its pooled rows to the row stores
    on the device: their copies are queued, never waited for in the batch."""
    from vitscope.cache.request import FeatureRequest
    from vitscope.engine.feature_rows import FeatureRows
    from vitscope.models.views import StandardView

    root = synthesize(tmp_path / "world", "coco", n=8, size=64, seed=4)
    rows = FeatureRows([FeatureRequest("resid_post", pooling) for pooling in ("cls", "spatial_mean", "spatial")],
                       StandardView(), workdir=tmp_path / "rows")
    _watched(rows)
    _hits.clear()
    late = mock.patch.object(host_copy, "_copy_event", lambda cuda, device=None: _CopyEvent())
    with _spied_methods(), _Watch(), late:
        vitscope.run(vitscope.load_model("tiny-vit-sup"), f"{root}::coco", [rows], batch_size=4, progress=False,
                     workers=0)
    assert [len(rows.store(k)) for k in range(3)] == [8, 8, 8]
    found = [f"{what} at {where} ({count}x)" for (name, what, where), count in _hits.items() if name == rows.name]
    assert not found, "the feature cache's pass copies to the host in its hot loop:\n" + "\n".join(found)
