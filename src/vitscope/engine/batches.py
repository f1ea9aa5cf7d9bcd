"""Read a source in batches, one batch ahead of the model, skipping (and noting) unreadable images."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from vitscope.data.images import ImageLoadError, SkippedImage, SkippedImageWarning
from vitscope.data.source import Source

__all__ = ["LoadedBatch", "SkipLog", "TargetTransforms", "iter_batches", "shard_range"]


@dataclass
class LoadedBatch:
    """Decoded images of one batch (unreadable ones left out) with their ground truth.

    Attributes:
        images: the decoded RGB images.
        indices: their positions in the source.
        paths: their names in outputs.
        targets: ground-truth key -> one value per image.
        pixels: ``[B, 3, H, W]`` when the loader also preprocessed them (the model's own preprocessing).
    """

    images: list[Any]
    indices: list[int]
    paths: list[str]
    targets: dict[str, list[Any]] = field(default_factory=dict)
    pixels: torch.Tensor | None = None


@dataclass
class SkipLog:
    """The unreadable images of one run (the run keeps them; the source is never written to)."""

    skipped: list[SkippedImage] = field(default_factory=list)

    def add(self, path: str, reason: str, warn: bool = True) -> None:
        if any(s.path == path for s in self.skipped):
            return
        self.skipped.append(SkippedImage(path=path, reason=reason))
        if warn:
            warnings.warn(f"skipping image: cannot read {path}: {reason}", SkippedImageWarning, stacklevel=2)


#: ``{new target: (source target, function)}``: ground-truth work done in the loading thread
TargetTransforms = dict[str, tuple[str, Callable[[Any], Any]]]


def _load(source: Source, indices: range, strict: bool, log: SkipLog, regions: bool,
          preprocess: Callable[[list[Any]], torch.Tensor] | None,
          transforms: TargetTransforms | None = None) -> LoadedBatch | None:
    batch = LoadedBatch([], [], [])
    per_image: list[dict[str, Any]] = []
    for i in indices:
        try:
            image, targets = source.load_checked(i)
        except ImageLoadError as err:
            if strict:
                raise
            log.add(source.path(i), err.reason)
            continue
        if regions:
            try:
                targets["regions"] = source.regions(i)
            except ValueError:  # this image (or this source) has none: the analysis says so
                targets["regions"] = None
        for key, (given, fn) in (transforms or {}).items():
            targets[key] = fn(targets[given]) if targets.get(given) is not None else None
        batch.images.append(image)
        batch.indices.append(i)
        batch.paths.append(source.path(i))
        per_image.append(targets)
    if not batch.images:
        return None
    keys = dict.fromkeys(k for t in per_image for k in t)
    batch.targets = {k: [t.get(k) for t in per_image] for k in keys}  # None where an image lacks a key
    if preprocess is not None:
        batch.pixels = preprocess(batch.images)
    return batch


def shard_range(n: int, rank: int, world: int) -> range:
    """The positions rank ``rank`` of ``world`` processes reads: the ``rank``-th of ``world`` contiguous parts of
    ``0 .. n`` (sizes differ by at most one). Contiguous parts keep images of neighbouring indices in one
    process, so a statistic over index minibatches (minibatch CKA) has open minibatches only at the edges of
    each part, whatever the batch size."""
    return range(rank * n // world, (rank + 1) * n // world)


def iter_batches(source: Source, batch_size: int, limit: int | None = None, start: int = 0, strict: bool = False,
                 log: SkipLog | None = None, regions: bool = False,
                 preprocess: Callable[[list[Any]], torch.Tensor] | None = None, shard: tuple[int, int] = (0, 1),
                 transforms: TargetTransforms | None = None) -> Iterator[tuple[int, LoadedBatch | None]]:
    """Yield ``(end_position, batch)`` over positions ``start .. n``; decoding runs one batch ahead.

    Args:
        source: what to read.
        batch_size: images per batch.
        limit: read only the first ``limit`` positions.
        start: first position (a resumed run).
        strict: raise on an unreadable image instead of skipping it.
        log: where skipped images are noted (one warning each).
        regions: add ``targets["regions"]`` (the source's region masks and labels) to every image.
        preprocess: images -> pixels, run in the loading thread too (None: leave it to the caller).
        shard: ``(rank, world)``: read only this rank's part of the positions (:func:`shard_range`).
        transforms: ground-truth work per image (:meth:`vitscope.Analysis.target_transforms`), in the loading
            thread too.

    A batch whose every image was unreadable is yielded as None so callers can still count progress.
    """
    log = log if log is not None else SkipLog()
    n = len(source) if limit is None else min(limit, len(source))
    part = shard_range(n, *shard)
    ranges = [range(s, min(s + batch_size, part.stop)) for s in range(max(start, part.start), part.stop, batch_size)]
    if not ranges:
        return
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(_load, source, ranges[0], strict, log, regions, preprocess, transforms)
        for k, r in enumerate(ranges):
            batch = pending.result()
            if k + 1 < len(ranges):
                pending = pool.submit(_load, source, ranges[k + 1], strict, log, regions, preprocess, transforms)
            yield r.stop, batch
