"""Asynchronous host copies (vitscope.cache.host_copy) and the row store's use of them, on the CPU: the same code
runs on CUDA with pinned buffers and events."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vitscope.cache import host_copy
from vitscope.cache.host_copy import HostCopies, numpy_dtype, start_host_copy, torch_dtype
from vitscope.cache.rowstore import RowStore


def test_a_copy_holds_the_values_and_not_later_changes_of_the_source() -> None:
    x = torch.arange(12.0).reshape(3, 4)
    array, event = start_host_copy(x, torch.float64)
    x.add_(100)
    assert event is None  # on the CPU the copy has ended when it returns
    assert array.dtype == np.float64 and array.shape == (3, 4)
    np.testing.assert_array_equal(array, np.arange(12.0).reshape(3, 4))


def test_dtypes_translate_both_ways() -> None:
    for dtype in (torch.float32, torch.float64, torch.int64, torch.bool, torch.float16, torch.uint8):
        assert torch_dtype(numpy_dtype(dtype)) == dtype
    assert torch_dtype("<f4") == torch.float32


class _Event:
    def __init__(self, done: bool) -> None:
        self.done, self.waited = done, False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited, self.done = True, True


def test_settle_forgets_finished_copies_in_order_and_wait_blocks_on_the_rest() -> None:
    copies = HostCopies()
    first, second, third = _Event(True), _Event(False), _Event(True)
    for e in (first, None, second, third):
        copies.add(e)
    assert len(copies) == 3
    assert not copies.settle()  # the second is unfinished: the third waits behind it (stream order)
    assert len(copies) == 2 and not first.waited
    copies.wait()
    assert len(copies) == 0 and second.waited and third.waited


def test_a_row_store_waits_before_it_reads_spills_or_pickles(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    import pickle

    made: list[_Event] = []

    def event(cuda: bool, device=None) -> _Event:
        made.append(_Event(False))
        return made[-1]

    monkeypatch.setattr(host_copy, "_copy_event", event)
    store = RowStore(spill_bytes=1 << 20)
    store.append({"x": torch.ones(2, 3), "i": np.arange(2)})
    store.append({"x": torch.zeros(1, 3, dtype=torch.float64), "i": np.arange(2, 3)})  # converted to float32
    assert [e.waited for e in made] == [False, False] and store.schema["x"] == ("<f4", (3,))
    assert store.column("x").tolist() == [[1.0] * 3, [1.0] * 3, [0.0] * 3]
    assert all(e.waited for e in made)
    store.append({"x": torch.ones(1, 3), "i": np.arange(3, 4)})
    pickle.dumps(store)
    assert made[-1].waited
    store.append({"x": torch.ones(1, 3), "i": np.arange(4, 5)})
    store.flush()
    assert made[-1].waited and store.memory_bytes == 0 and len(store) == 5
