"""Read a source in batches ahead of the model, skipping (and noting) unreadable images.

With ``workers=0`` one thread of this process decodes one batch ahead. With ``workers=N`` a
``torch.utils.data.DataLoader`` runs the same per-batch function in N forked processes, ``2 * N`` batches ahead,
in order, with pinned pixels for a GPU: the batches, and so every number, are the same either way. Workers are
forked (Linux), so sources, preprocessing and ground-truth functions reach them without pickling; elsewhere
the loader falls back to the thread.
"""

from __future__ import annotations

import contextvars
import functools
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from vitscope.data.images import ImageLoadError, SkippedImage, SkippedImageWarning, one_line
from vitscope.data.source import Source
from vitscope.engine.processes import quiet_worker

__all__ = ["ImageTransforms", "LoadedBatch", "LoaderClock", "SkipLog", "TargetTransforms", "iter_batches",
           "loader_bound_note", "shard_range"]


@dataclass
class LoadedBatch:
    """Decoded images of one batch (unreadable ones left out) with their ground truth.

    Attributes:
        images: the decoded RGB images.
        indices: their positions in the source.
        paths: their names in outputs.
        targets: ground-truth key -> one value per image.
        pixels: ``[B, 3, H, W]`` when the loader also preprocessed them (the model's own preprocessing); the
            decoded images are then not kept (``images`` is empty). Images that keep their aspect ratio (a token
            budget) come as a list of ``(positions, [b, 3, H, W])`` groups, one per input size.
        skipped: ``(path, reason)`` of the images of this batch that could not be read.
        error: with ``strict``, the first unreadable image's error (raised by the consumer, in its process).
    """

    images: list[Any]
    indices: list[int]
    paths: list[str]
    targets: dict[str, list[Any]] = field(default_factory=dict)
    pixels: torch.Tensor | list[tuple[list[int], torch.Tensor]] | None = None
    skipped: list[tuple[str, str]] = field(default_factory=list)
    error: ImageLoadError | None = None

    def pin_memory(self) -> LoadedBatch:
        """The same batch with its pixels in page-locked memory (the DataLoader calls this for a GPU)."""
        if isinstance(self.pixels, list):
            self.pixels = [(positions, pixels.pin_memory()) for positions, pixels in self.pixels]
        elif self.pixels is not None:
            self.pixels = self.pixels.pin_memory()
        return self


@dataclass
class SkipLog:
    """The unreadable images of one run (the run keeps them; the source is never written to)."""

    skipped: list[SkippedImage] = field(default_factory=list)

    def add(self, path: str, reason: str, warn: bool = True) -> None:
        if any(s.path == path for s in self.skipped):
            return
        self.skipped.append(SkippedImage(path=path, reason=reason))
        if warn:
            # one line, as --strict's error: a file name may hold a newline
            warnings.warn(one_line(f"skipping image: cannot read {path}: {reason}"), SkippedImageWarning,
                          stacklevel=2)


#: ``{new target: (source target, function)}``: ground-truth work done in the loading thread
TargetTransforms = dict[str, tuple[str, Callable[[Any], Any]]]
#: ``{new target: function}``: per-image work on the preprocessed ``[H, W, 3]`` uint8 image, in the loading thread
ImageTransforms = dict[str, Callable[[np.ndarray], Any]]


def _frames(pixels: torch.Tensor | list[tuple[list[int], torch.Tensor]], n: int) -> list[np.ndarray] | None:
    """The ``n`` images of a batch as the loader preprocessed them: ``[H, W, 3]`` uint8 each (its own size in
    groups of one input size), in batch order; None when the pixels are not uint8 (a backbone's own
    preprocessing, already normalised)."""
    groups = pixels if isinstance(pixels, list) else [(range(n), pixels)]
    if any(p.dtype != torch.uint8 for _, p in groups):
        return None
    frames: list[np.ndarray] = [np.empty(0, dtype=np.uint8)] * n
    for positions, p in groups:
        for j, position in enumerate(positions):
            frames[position] = np.ascontiguousarray(p[j].permute(1, 2, 0).numpy())
    return frames


def _image_targets(pixels: torch.Tensor | list[tuple[list[int], torch.Tensor]], n: int,
                   work: ImageTransforms) -> dict[str, list[Any]]:
    """``{new target: one value per image}`` of the per-image work on the batch's uint8 pixels (empty when the
    loader's pixels are not uint8: the analyses then do that work themselves)."""
    frames = _frames(pixels, n) if work else None
    if frames is None:
        return {}
    return {key: [fn(frame) for frame in frames] for key, fn in work.items()}


def _load(source: Source, indices: range, strict: bool, regions: bool,
          preprocess: Callable[[list[Any]], torch.Tensor] | None,
          transforms: TargetTransforms | None = None, images: ImageTransforms | None = None) -> LoadedBatch:
    """Decode (and preprocess) one batch; unreadable images are noted in the batch, not raised, so that the
    same function serves a thread and a worker process."""
    batch = LoadedBatch([], [], [])
    per_image: list[dict[str, Any]] = []
    for i in indices:
        try:
            image, targets = source.load_checked(i)
        except ImageLoadError as err:
            if strict:
                batch.error = err
                return batch
            batch.skipped.append((source.path(i), err.reason))
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
    if not batch.indices:
        return batch
    keys = dict.fromkeys(k for t in per_image for k in t)
    batch.targets = {k: [t.get(k) for t in per_image] for k in keys}  # None where an image lacks a key
    if preprocess is not None:
        batch.pixels = preprocess(batch.images)
        batch.images = []  # not needed any more: a worker need not send them back
        batch.targets.update(_image_targets(batch.pixels, len(batch.indices), images or {}))
    return batch


def _received(batch: LoadedBatch, log: SkipLog) -> LoadedBatch | None:
    """The consumer's side of a loaded batch: note its skipped images, raise its error, None when empty."""
    for path, reason in batch.skipped:
        log.add(path, reason)
    if batch.error is not None:
        raise batch.error
    return batch if batch.indices else None


class _BatchJobs(torch.utils.data.Dataset):
    """Batch ``k`` of a pass as a DataLoader item (the DataLoader's own batching is off)."""

    def __init__(self, source: Source, ranges: list[range], strict: bool, regions: bool,
                 preprocess: Callable[[list[Any]], torch.Tensor] | None, transforms: TargetTransforms | None,
                 images: ImageTransforms | None = None) -> None:
        self.source, self.ranges, self.strict, self.regions = source, ranges, strict, regions
        self.preprocess, self.transforms, self.images = preprocess, transforms, images

    def __len__(self) -> int:
        return len(self.ranges)

    def __getitem__(self, k: int) -> LoadedBatch:
        return _load(self.source, self.ranges[k], self.strict, self.regions, self.preprocess, self.transforms,
                     self.images)


def _quiet_worker(parent: int, _: int) -> None:
    quiet_worker(parent, (signal.SIGINT, signal.SIGTERM))  # the DataLoader's worker_init_fn passes its number too


def workers_used(workers: int, batches: int) -> int:
    """The worker processes a loader of ``batches`` batches starts for ``workers`` asked: none where processes
    cannot be forked (a thread loads instead), and no more than one per batch."""
    return min(workers, batches) if workers > 0 and sys.platform.startswith("linux") else 0


def _in_workers(jobs: _BatchJobs, workers: int, pin: bool) -> Iterator[LoadedBatch]:
    loader = torch.utils.data.DataLoader(jobs, batch_size=None, shuffle=False, num_workers=workers,
                                         pin_memory=pin, prefetch_factor=2, multiprocessing_context="fork",
                                         worker_init_fn=functools.partial(_quiet_worker, os.getpid()))
    batches = iter(loader)
    try:
        yield from batches
    finally:  # the workers stop with the pass (an error, Ctrl-C), not when a traceback holding it is collected
        stop = getattr(batches, "_shutdown_workers", None)  # what the iterator's own __del__ calls
        if stop is not None:
            stop()


def _in_a_thread(jobs: _BatchJobs) -> Iterator[LoadedBatch]:
    # each load runs in a copy of this thread's context: the decoding settings of the pass (data.images) hold there
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(contextvars.copy_context().run, jobs.__getitem__, 0)
        for k in range(len(jobs)):
            batch = pending.result()
            if k + 1 < len(jobs):
                pending = pool.submit(contextvars.copy_context().run, jobs.__getitem__, k + 1)
            yield batch


class LoaderClock:
    """Wraps a pass's batch iterator and measures how long the pass waited for its next batch."""

    def __init__(self, batches: Iterator[Any]) -> None:
        self._batches, self.waited, self.started = batches, 0.0, time.perf_counter()

    def __iter__(self) -> Iterator[Any]:
        while True:
            start = time.perf_counter()
            try:
                item = next(self._batches)
            except StopIteration:
                return
            self.waited += time.perf_counter() - start
            yield item

    def close(self) -> None:
        """Stop the batch iterator (its loading thread or worker processes) where the pass stopped."""
        close = getattr(self._batches, "close", None)
        if close is not None:
            close()

    @property
    def elapsed(self) -> float:
        """Seconds since the pass began."""
        return time.perf_counter() - self.started

    @property
    def wait_fraction(self) -> float:
        """Share of :attr:`elapsed` spent waiting for batches (0 to 1)."""
        elapsed = self.elapsed
        return self.waited / elapsed if elapsed > 0 else 0.0


#: a pass shorter than this says nothing about its loader; at least this share of waiting makes the loader the
#: bottleneck
LOADER_NOTE_SECONDS, LOADER_BOUND = 10.0, 0.5


def loader_bound_note(wait_fraction: float, elapsed: float, workers: int) -> str | None:
    """One line when the images, not the model, set the pace of a pass (None otherwise)."""
    if elapsed < LOADER_NOTE_SECONDS or wait_fraction < LOADER_BOUND:
        return None
    how = (f"{workers} worker process{'es' if workers != 1 else ''} decoding" if workers
           else "decoded in a thread of this process")
    return (f"the loader was the bottleneck: the pass waited for images {wait_fraction:.0%} of its {elapsed:.0f} s "
            f"({how}); more --workers, or faster storage, would make it faster")


def shard_range(n: int, rank: int, world: int) -> range:
    """The positions rank ``rank`` of ``world`` processes reads: the ``rank``-th of ``world`` contiguous parts of
    ``0 .. n`` (sizes differ by at most one). Contiguous parts keep images of neighbouring indices in one
    process, so a statistic over index minibatches (minibatch CKA) has open minibatches only at the edges of
    each part, whatever the batch size."""
    return range(rank * n // world, (rank + 1) * n // world)


def iter_batches(source: Source, batch_size: int, limit: int | None = None, start: int = 0, strict: bool = False,
                 log: SkipLog | None = None, regions: bool = False,
                 preprocess: Callable[[list[Any]], torch.Tensor] | None = None, shard: tuple[int, int] = (0, 1),
                 transforms: TargetTransforms | None = None, workers: int = 0, pin: bool = False,
                 images: ImageTransforms | None = None) -> Iterator[tuple[int, LoadedBatch | None]]:
    """Yield ``(end_position, batch)`` over positions ``start .. n``, decoded ahead of the caller.

    Args:
        source: what to read.
        batch_size: images per batch.
        limit: read only the first ``limit`` positions.
        start: first position (a resumed run).
        strict: raise on an unreadable image instead of skipping it.
        log: where skipped images are noted (one warning each).
        regions: add ``targets["regions"]`` (the source's region masks and labels) to every image.
        preprocess: images -> pixels, run where the decoding runs (None: leave it to the caller, who then gets
            the decoded images).
        shard: ``(rank, world)``: read only this rank's part of the positions (:func:`shard_range`).
        transforms: ground-truth work per image (:meth:`vitscope.Analysis.target_transforms`), where the
            decoding runs too.
        workers: processes decoding (0: one thread of this process, one batch ahead).
        pin: page-locked pixels, for a non-blocking copy to a GPU (with workers).
        images: per-image work on the preprocessed images (:meth:`vitscope.Analysis.image_transforms`, the
            loader's part of the shared quantities), where the decoding runs too; it needs ``preprocess`` to
            give uint8 pixels (the model's resize and crop), and is skipped otherwise.

    A batch whose every image was unreadable is yielded as None so callers can still count progress.
    """
    log = log if log is not None else SkipLog()
    n = len(source) if limit is None else min(limit, len(source))
    part = shard_range(n, *shard)
    ranges = [range(s, min(s + batch_size, part.stop)) for s in range(max(start, part.start), part.stop, batch_size)]
    if not ranges:
        return
    jobs = _BatchJobs(source, ranges, strict, regions, preprocess, transforms, images)
    used = workers_used(workers, len(ranges))
    loaded = _in_workers(jobs, used, pin) if used else _in_a_thread(jobs)
    try:
        for r, batch in zip(ranges, loaded, strict=True):
            yield r.stop, _received(batch, log)
    finally:
        loaded.close()
