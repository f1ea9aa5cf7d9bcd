"""Drawing a run's figures: one after the other, or in forked worker processes when there are many.

A default ``analyze`` draws about 40 matplotlib figures at 0.2-0.8 s each; that, not the data, is most of
the writing time. Figures are closures over their result (``Figure.draw``), which cannot be pickled, so the
workers are forked: each inherits the figures and draws the ones it is given by number, writing its files
into the staging folder; only the paths come back. Fork is used on Linux only (macOS and Windows start
processes anew, and fork is unsafe with their system libraries); elsewhere, with one CPU or with a few
figures, drawing stays in this process. ``VITSCOPE_FIGURE_WORKERS`` sets the number of processes (1: none).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from vitscope.analyses.result import Figure
from vitscope.errors import VitscopeValueError

__all__ = ["MIN_FIGURES_PER_WORKER", "draw_figures", "figure_workers"]

#: a worker is worth forking for at least this many figures
MIN_FIGURES_PER_WORKER = 4
_MAX_WORKERS = 8

# The figures of the pass being drawn, inherited by forked workers (set only while a pool runs).
_JOBS: Sequence[tuple[Figure, Path]] = ()


def figure_workers(count: int, cpus: int | None = None) -> int:
    """Processes to draw ``count`` figures with: ``VITSCOPE_FIGURE_WORKERS`` or one per CPU, at most one per
    :data:`MIN_FIGURES_PER_WORKER` figures and 8; 1 where fork is not used."""
    setting = os.environ.get("VITSCOPE_FIGURE_WORKERS", "").strip()
    if setting:
        try:
            wanted = int(setting)
        except ValueError:
            raise VitscopeValueError(f"VITSCOPE_FIGURE_WORKERS must be a whole number, got {setting!r}") from None
        if wanted < 1:
            raise VitscopeValueError(f"VITSCOPE_FIGURE_WORKERS must be at least 1, got {wanted}")
    else:
        wanted = _MAX_WORKERS
    if not sys.platform.startswith("linux"):
        return 1
    if cpus is None:
        cpus = len(os.sched_getaffinity(0))
    return max(1, min(wanted, cpus, count // MIN_FIGURES_PER_WORKER))


def _quiet_worker(parent: int) -> None:
    import torch

    from vitscope.engine.processes import quiet_worker

    torch.set_num_threads(1)  # figures do small tensor work; a worker per CPU already uses them all
    quiet_worker(parent)  # Ctrl-C is the run's to report; the pool's end is SIGTERM, which must still end them


def _draw(i: int) -> tuple[int, list[str]]:
    fig, stem = _JOBS[i]
    return i, [str(p) for p in fig.draw(stem)]


def draw_figures(jobs: Sequence[tuple[Figure, Path]], advance: Callable[[], None] = lambda: None,
                 workers: int | None = None, meanwhile: Callable[[], None] | None = None) -> list[list[Path]]:
    """Draw every ``(figure, path without suffix)``; returns each figure's written files, in job order.

    Args:
        jobs: the figures and where to draw them.
        advance: called once per drawn figure (the progress bar).
        workers: processes (default :func:`figure_workers`).
        meanwhile: other work for this process while the workers draw (run first when drawing here).
    """
    global _JOBS
    workers = figure_workers(len(jobs)) if workers is None else workers
    if workers <= 1:
        if meanwhile is not None:
            meanwhile()
        drawn = []
        for fig, stem in jobs:
            drawn.append([Path(p) for p in fig.draw(stem)])
            advance()
        return drawn
    out: list[list[Path]] = [[] for _ in jobs]
    _JOBS = jobs
    try:
        fork = multiprocessing.get_context("fork")
        with fork.Pool(workers, initializer=_quiet_worker, initargs=(os.getpid(),)) as pool:
            pending = pool.imap_unordered(_draw, range(len(jobs)))
            if meanwhile is not None:  # tables and arrays are written while the figures are drawn
                meanwhile()
            for i, paths in pending:
                out[i] = [Path(p) for p in paths]
                advance()
    finally:
        _JOBS = ()
    return out
