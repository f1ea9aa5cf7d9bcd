"""Copies of device tensors to the host that do not make the host wait for the device.

A ``tensor.cpu()`` of a CUDA tensor blocks the Python thread until every kernel queued before it has run, which,
once per batch, keeps the GPU idle while the host catches up. :func:`start_host_copy` instead queues the copy into
a fresh page-locked buffer (``pin_memory``, ``non_blocking``) and records an event; the buffer's numpy view exists
at once, and its values may be read once :meth:`HostCopies.wait` (or :meth:`HostCopies.settle`) says the copy has
finished, which, for rows read at the end of a pass, it has long done. On the CPU the same code makes a plain
copy that is finished when it returns (the copy also means later in-place changes of the source are not seen).

This module is the one place where row stores touch tensors' memory on the host in the hot loop (the no-host-sync
contract test allows it here and nowhere else).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["HostCopies", "LaggedSnapshot", "numpy_dtype", "start_host_copy", "torch_dtype"]


def torch_dtype(dtype: np.dtype | str) -> torch.dtype:
    """The torch dtype of a numpy dtype (``"<f4"`` -> ``torch.float32``)."""
    return torch.from_numpy(np.empty(0, dtype=np.dtype(dtype))).dtype


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of a torch dtype (``torch.float32`` -> ``float32``); bfloat16 has none (raises)."""
    return torch.empty(0, dtype=dtype).numpy().dtype


def start_host_copy(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> tuple[np.ndarray, Any]:
    """Queue a copy of ``tensor`` (converted to ``dtype`` on its device first) into new host memory.

    Args:
        tensor: ``[*shape]`` on any device.
        dtype: dtype of the copy (default: the tensor's).

    Returns:
        ``(array, event)``: the numpy view ``[*shape]`` of the host buffer (its values are valid once the copy
        has finished) and the CUDA event that marks the end of the copy (None when it is already finished).
    """
    source = tensor.detach()
    if dtype is not None and source.dtype != dtype:
        source = source.to(dtype)
    cuda = source.device.type == "cuda"
    host = torch.empty(source.shape, dtype=source.dtype, pin_memory=cuda)
    host.copy_(source, non_blocking=cuda)
    return host.numpy(), _copy_event(cuda, source.device)


def _copy_event(cuda: bool, device: Any = None) -> Any:
    """The event that marks the end of the copy just queued on ``device``'s current stream (None on the CPU, where
    it has ended)."""
    if not cuda:
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


class HostCopies:
    """The copies a holder of host buffers still waits for (their events, oldest first)."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def add(self, event: Any) -> None:
        if event is not None:
            self.events.append(event)

    def settle(self) -> bool:
        """Forget the copies that have finished, without waiting; True when none is left."""
        while self.events and self.events[0].query():
            self.events.pop(0)
        return not self.events

    def wait(self) -> None:
        """Block until every queued copy has finished (before the buffers' values are read)."""
        for event in self.events:
            event.synchronize()
        self.events.clear()

    def __len__(self) -> int:
        return len(self.events)

    def __getstate__(self) -> dict[str, Any]:
        self.wait()  # a pickled holder's buffers must hold their values
        return {"events": []}


class LaggedSnapshot:
    """Host copies of small device tensors taken batch after batch, read once their copy has finished: what a hot
    loop uses to prune host-side bookkeeping by device results without waiting (one batch late on a GPU, at once
    on the CPU).

    Not state: a copy or pickle of a holder starts with no snapshot.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[Any, tuple[np.ndarray, ...], list[Any]]] = []

    def take(self, tag: Any, *tensors: torch.Tensor) -> None:
        """Queue host copies of ``tensors`` under ``tag`` (e.g. the batch's sequence number)."""
        copies = [start_host_copy(t) for t in tensors]
        self._pending.append((tag, tuple(a for a, _ in copies), [e for _, e in copies if e is not None]))

    def latest(self) -> tuple[Any, tuple[np.ndarray, ...]] | None:
        """``(tag, arrays)`` of the newest snapshot whose copies have finished (older ones are dropped), or None
        when none has finished yet; never waits."""
        done = None
        while self._pending and all(e.query() for e in self._pending[0][2]):
            tag, arrays, _ = self._pending.pop(0)
            done = (tag, arrays)
        return done

    def __deepcopy__(self, memo: dict) -> LaggedSnapshot:
        return LaggedSnapshot()

    def __getstate__(self) -> dict[str, Any]:
        return {"_pending": []}
