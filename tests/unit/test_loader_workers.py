"""Decoding in worker processes (``workers=N``): how many are chosen, and that the batches are those of the one
loading thread: the same images, pixels and ground truth in the same order, unreadable images noted once in the
consumer's log, ``strict`` raising the same error, a resumed start and a rank's share read alike."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitscope
from vitscope.data.images import ImageLoadError
from vitscope.engine.batches import SkipLog, iter_batches
from vitscope.engine.settings import MIN_IMAGES_FOR_WORKERS, loader_workers
from vitscope.errors import VitscopeValueError


@pytest.mark.parametrize(("requested", "images", "cpus", "processes", "want"), [
    (3, 10, 16, 1, 3),  # a number given is kept, also for a short pass
    (0, 10_000, 16, 1, 0),
    (None, MIN_IMAGES_FOR_WORKERS - 1, 16, 1, 0),  # a short pass decodes in a thread
    (None, MIN_IMAGES_FOR_WORKERS, 16, 1, 8),  # one per CPU less one, at most 8
    (None, 5000, 4, 1, 3),
    (None, 5000, 2, 1, 1),
    (None, 5000, 16, 2, 7),  # two processes on the machine share its CPUs
    (None, 5000, 2, 2, 1),  # at least one
])
def test_the_number_of_workers(monkeypatch, requested, images, cpus, processes, want) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cpus)))
    assert loader_workers(requested, images, processes) == want


def test_a_negative_number_of_workers_is_refused() -> None:
    with pytest.raises(VitscopeValueError, match="workers must be 0 or more, got -1"):
        loader_workers(-1, 100)


@pytest.fixture
def folder(tmp_path):
    """11 PNGs of different sizes, the 5th unreadable."""
    rng = np.random.default_rng(0)
    for i in range(11):
        path = tmp_path / f"{i:02d}.png"
        if i == 4:
            path.write_bytes(b"not an image")
        else:
            Image.fromarray(rng.integers(0, 255, (20 + i, 30, 3), dtype=np.uint8)).save(path)
    return tmp_path


def _batches(source, workers: int, **kwargs):
    backbone = vitscope.load_model("tiny-vit")
    log = SkipLog()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = [(end, b) for end, b in iter_batches(source, 3, preprocess=backbone.preprocess, log=log,
                                                    workers=workers, **kwargs)]
    return out, log, [str(w.message) for w in caught]


@pytest.mark.parametrize("kwargs", [{}, {"start": 6}, {"shard": (1, 2)}, {"limit": 8}])
def test_workers_yield_the_batches_of_the_thread(folder, kwargs) -> None:
    source = vitscope.data.as_source(str(folder))
    (one, one_log, one_warned), (two, two_log, two_warned) = (_batches(source, w, **kwargs) for w in (0, 2))
    assert [end for end, _ in one] == [end for end, _ in two]
    for (_, a), (_, b) in zip(one, two, strict=True):
        assert a.indices == b.indices and a.paths == b.paths and a.targets == b.targets
        assert torch.equal(a.pixels, b.pixels)
        assert a.images == b.images == []  # preprocessed where decoded: the images stay there
    assert one_log.skipped == two_log.skipped
    assert one_warned == two_warned
    if not kwargs or kwargs.get("limit"):
        assert [s.path for s in two_log.skipped] == [str(folder / "04.png")] and len(two_warned) == 1


def test_strict_raises_the_unreadable_image_from_a_worker(folder) -> None:
    source = vitscope.data.as_source(str(folder))
    with pytest.raises(ImageLoadError, match="04.png"):
        _batches(source, 2, strict=True)


def _children() -> list[int]:
    """Processes whose parent is this one (the loader's workers), from /proc."""
    import os

    mine = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == os.getpid():
                mine.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return mine


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads child processes from /proc")
def test_the_workers_stop_when_the_pass_fails_even_while_its_error_is_kept(folder) -> None:
    """An analysis that raises, or an unreadable image under strict, ends the pass: its worker processes stop
    then, not when the error (kept by a notebook as sys.last_traceback) is collected."""
    from helpers.failing import FailingAnalysis

    backbone = vitscope.load_model("tiny-vit")
    before = set(_children())
    kept = []
    for analyses, strict in (([FailingAnalysis(3)], False), (["attention_distance"], True)):
        try:
            vitscope.run(backbone, str(folder), analyses, batch_size=3, workers=2, progress=False, strict=strict)
        except (RuntimeError, ImageLoadError) as err:
            kept.append(err)  # the traceback, and the pass's frames with it, stay alive
        deadline = time.monotonic() + 10
        while set(_children()) - before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not set(_children()) - before, f"workers still running after {type(kept[-1]).__name__}"
    assert len(kept) == 2


def test_without_preprocessing_the_decoded_images_come_back(folder) -> None:
    source = vitscope.data.as_source(str(folder))
    got = [b for _, b in iter_batches(source, 4, workers=2)]
    want = [b for _, b in iter_batches(source, 4, workers=0)]
    assert [[im.tobytes() for im in b.images] for b in got] == [[im.tobytes() for im in b.images] for b in want]
    assert all(b.pixels is None for b in got)


def test_resizing_in_the_loader_and_normalising_on_the_device_give_the_preprocessing_bits() -> None:
    """The loader sends uint8 pixels and the pass normalises them where the model runs: for every byte value and
    the usual means and stds, the float32 result equals the one-step preprocessing (numpy float32 / 255, then
    torch (x - mean) / std)."""
    import dataclasses

    from vitscope.models.preprocess import normalise_pixels, preprocess_images, resized_pixels

    spec = vitscope.load_model("tiny-vit").spec
    every = torch.arange(256, dtype=torch.uint8).repeat(3, 1).view(1, 3, 16, 16)
    for mean, std in [((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)), ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
                      ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))]:
        s = dataclasses.replace(spec, mean=mean, std=std)
        as_floats = torch.from_numpy(every.permute(0, 2, 3, 1).numpy().astype(np.float32) / 255.0).permute(0, 3, 1, 2)
        want = (as_floats - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
        assert torch.equal(normalise_pixels(every, s), want)
    rng = np.random.default_rng(1)
    images = [Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)) for h, w in [(37, 50), (90, 64)]]
    assert resized_pixels(images, spec).dtype == torch.uint8
    assert torch.equal(normalise_pixels(resized_pixels(images, spec), spec), preprocess_images(images, spec))


def test_a_pass_that_waits_for_images_says_the_loader_is_the_bottleneck() -> None:
    from vitscope.engine.batches import LoaderClock, loader_bound_note

    def slow():
        for i in range(3):
            time.sleep(0.05)
            yield i

    clock = LoaderClock(slow())
    assert list(clock) == [0, 1, 2] and clock.waited >= 0.15 and clock.wait_fraction > 0.9
    note = loader_bound_note(0.8, 60.0, 0)
    assert note and "80% of its 60 s" in note and "a thread" in note and "--workers" in note
    assert "4 worker processes" in loader_bound_note(0.6, 30.0, 4)
    assert loader_bound_note(0.4, 60.0, 4) is None  # the model set the pace
    assert loader_bound_note(0.9, 2.0, 0) is None  # too short a pass to say


def test_run_tells_its_log_when_the_loader_set_the_pace(monkeypatch) -> None:
    import vitscope.engine.batches as batches

    monkeypatch.setattr(batches, "LOADER_NOTE_SECONDS", 0.0)
    monkeypatch.setattr(batches, "LOADER_BOUND", 0.0)
    said: list[str] = []
    backbone = vitscope.load_model("tiny-vit")
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)) for _ in range(4)]
    vitscope.run(backbone, images, ["attention_distance"], batch_size=2, progress=False, log=said.append)
    assert any(line.startswith("the loader was the bottleneck") for line in said), said


def test_a_run_says_how_many_workers_ran(folder) -> None:
    """Four batches take four of eight workers asked: results (and results.json's run entry) say four."""
    backbone = vitscope.load_model("tiny-vit")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ran = vitscope.run(backbone, str(folder), ["attention_distance"], batch_size=3, workers=8, progress=False)
        alone = vitscope.run(backbone, str(folder), ["attention_distance"], batch_size=3, workers=0, progress=False)
    assert ran.workers == 4 and alone.workers == 0
