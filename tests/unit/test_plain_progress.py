"""Without a terminal (cluster jobs, nohup, output in a file) progress is a plain line every N seconds."""

from __future__ import annotations

import io
import re
import time

import numpy as np
import pytest
from PIL import Image

import vitscope
from vitscope.analyses.attention.stats import AttentionStats
from vitscope.errors import VitscopeValueError

INTERVAL_ENV = "VITSCOPE_PROGRESS_SECONDS"

LINE = re.compile(r"^vitscope tiny-vit: (\d)/3 images \((\d+)%\), [\d.e+]+ images/s(, .* left)?$")


def test_a_pass_without_a_terminal_prints_plain_lines(capsys, monkeypatch, one_thread):
    """stderr is not a terminal here (captured): every batch is a line at a 0 s interval, each with the images done,
    the rate and the time left; the last says 3/3."""
    monkeypatch.setenv(INTERVAL_ENV, "0")
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)) for _ in range(3)]
    vitscope.run(vitscope.load_model("tiny-vit"), images, [AttentionStats()], batch_size=1)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("vitscope tiny-vit")]
    assert [LINE.match(ln).group(1) for ln in lines] == ["1", "2", "3"], lines
    assert all(LINE.match(ln).group(3) for ln in lines[:-1])
    assert lines[-1].startswith("vitscope tiny-vit: 3/3 images (100%)")


def test_plain_lines_only_by_default_and_only_after_the_interval(capsys, monkeypatch):
    from vitscope.engine.plain_progress import PlainProgress
    from vitscope.engine.settings import progress_bar

    monkeypatch.setenv(INTERVAL_ENV, "3600")
    assert isinstance(progress_bar(None), PlainProgress)  # stderr is captured: not a terminal
    assert not isinstance(progress_bar(False), PlainProgress) and progress_bar(False).disable
    with progress_bar(None) as bar:
        task = bar.add_task("m", total=10, unit="images")
        for _ in range(10):
            bar.advance(task)
    assert capsys.readouterr().err == ""  # a short pass: no line before the first interval, so none at the end


def test_plain_progress_counts_only_its_own_work_and_ends_with_a_line(capsys):
    """A resumed pass (started at 40 of 100) reports its own rate; the time left follows from it; a line at the end
    when the last one was earlier."""
    from vitscope.engine.plain_progress import PlainProgress

    bar = PlainProgress(interval=0)
    with bar:
        task = bar.add_task("m", total=100, completed=40, unit="images")
        bar.tasks[task].started -= 10.0  # as if 10 s had passed
        bar.update(task, completed=60)  # 20 images in 10 s: 2 images/s, 40 left: 20 s
        bar.interval = 3600
        bar.advance(task, 40)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("vitscope m: 60/100 images (60%), 2 images/s, about 20 s left"), lines
    assert lines[1].startswith("vitscope m: 100/100 images (100%), ") and "left" not in lines[1]


def test_a_bad_interval_is_refused_in_one_line(monkeypatch):
    from vitscope.engine.plain_progress import PlainProgress

    monkeypatch.setenv(INTERVAL_ENV, "soon")
    with pytest.raises(VitscopeValueError, match=f"{INTERVAL_ENV} must be a number of seconds"):
        PlainProgress()


def test_feature_extraction_shows_its_progress_and_its_loader_note(tmp_path, capsys, monkeypatch, one_thread):
    """``probe``'s passes (extract_features) showed nothing for as long as they ran, and dropped the note that the
    loader set the pace, which ``analyze`` prints."""
    import vitscope.engine.batches as batches
    from vitscope.cache.feature_cache import FeatureCache
    from vitscope.cache.request import FeatureRequest
    from vitscope.engine.extract import extract_features

    monkeypatch.setenv(INTERVAL_ENV, "0")
    monkeypatch.setattr(batches, "LOADER_NOTE_SECONDS", 0.0)
    monkeypatch.setattr(batches, "LOADER_BOUND", 0.0)
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)) for _ in range(3)]
    said: list[str] = []
    extract_features(vitscope.load_model("tiny-vit"), images, [FeatureRequest("resid_post", "cls")],
                     FeatureCache(tmp_path / "cache"), batch_size=1, workers=0, log=said.append)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("vitscope tiny-vit")]
    assert [LINE.match(ln).group(1) for ln in lines] == ["1", "2", "3"], lines
    assert any(line.startswith("the loader was the bottleneck") for line in said), said


def test_the_terminal_bar_shows_the_rate(monkeypatch):
    """The plain lines gave images/s; the terminal's bar did not."""
    import rich.console

    from vitscope.engine.settings import progress_bar

    screen = io.StringIO()
    terminal = rich.console.Console
    monkeypatch.setattr(rich.console, "Console", lambda **kw: terminal(file=screen, force_terminal=True, width=150))
    with progress_bar(None) as bar:
        task = bar.add_task("tiny-vit", total=10, unit="images")
        for k in range(1, 4):
            time.sleep(0.02)
            bar.update(task, completed=k)
    assert re.search(r"[\d.]+ images/s", screen.getvalue()), screen.getvalue()


def test_training_bars_go_to_stderr(capsys):
    """A training bar (guided MAE, zoo builds) went to stdout, among the results a script reads."""
    from vitscope.train.loop import _progress

    bar, task = _progress(True, "mae", 3)
    with bar:
        for _ in range(3):
            bar.update(task, advance=1, loss=0.5)
    captured = capsys.readouterr()
    assert "train" not in captured.out and "mae" in captured.err, captured
