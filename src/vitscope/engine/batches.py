"""Turn a dataset into preprocessed batches, skipping unreadable images, one batch ahead."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from vitscope.models.backbone import Backbone


class Dataset(Protocol):
    """What the engine reads: ``len``, ``get(i) -> item | None`` (None = skipped), ``skipped``."""

    skipped: list

    def __len__(self) -> int: ...

    def get(self, i: int) -> Any: ...


@dataclass
class LoadedBatch:
    pixels: torch.Tensor
    indices: list[int]
    paths: list[str]
    targets: dict[str, list[Any]] = field(default_factory=dict)


def _load(dataset: Dataset, backbone: Backbone, indices: range) -> LoadedBatch | None:
    items = [it for it in (dataset.get(i) for i in indices) if it is not None]
    if not items:
        return None
    targets: dict[str, list[Any]] = {}
    for it in items:
        for key, value in (getattr(it, "targets", None) or {}).items():
            targets.setdefault(key, []).append(value)
    return LoadedBatch(pixels=backbone.preprocess([it.image for it in items]), indices=[it.index for it in items],
                       paths=[it.path for it in items], targets=targets)


def iter_batches(dataset: Dataset, backbone: Backbone, batch_size: int, limit: int | None = None,
                 start: int = 0) -> Iterator[tuple[int, LoadedBatch | None]]:
    """Yield ``(end_position, batch)`` over dataset positions ``start .. n``; decoding runs one batch ahead.

    A batch whose every image was unreadable is yielded as None so callers can still count progress.
    """
    n = len(dataset) if limit is None else min(limit, len(dataset))
    ranges = [range(s, min(s + batch_size, n)) for s in range(start, n, batch_size)]
    if not ranges:
        return
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(_load, dataset, backbone, ranges[0])
        for k, r in enumerate(ranges):
            batch = pending.result()
            if k + 1 < len(ranges):
                pending = pool.submit(_load, dataset, backbone, ranges[k + 1])
            yield r.stop, batch
