"""Progress as plain lines, for a stderr that is not a terminal (cluster jobs, ``nohup``, output redirected to a
file), where a progress bar prints nothing: one line every ``VITSCOPE_PROGRESS_SECONDS`` seconds (default 30)
with the work done, its rate and the time left."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from vitscope.errors import VitscopeValueError

__all__ = ["INTERVAL_ENV", "PlainProgress", "interval_seconds"]

#: seconds between two progress lines when stderr is not a terminal
INTERVAL_ENV = "VITSCOPE_PROGRESS_SECONDS"
DEFAULT_INTERVAL = 30.0


def interval_seconds() -> float:
    """The interval from :data:`INTERVAL_ENV` (default 30 s).

    Raises:
        VitscopeValueError: the variable is not a number of seconds >= 0.
    """
    text = os.environ.get(INTERVAL_ENV, "").strip()
    if not text:
        return DEFAULT_INTERVAL
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise VitscopeValueError(f"{INTERVAL_ENV} must be a number of seconds (0 or more), got {text!r}")
    return value


def _duration(seconds: float) -> str:
    if seconds < 1:
        return "under a second"
    if seconds < 90:
        return f"about {seconds:.0f} s"
    if seconds < 90 * 60:
        return f"about {seconds / 60:.0f} min"
    return f"about {seconds / 3600:.1f} h"


@dataclass
class _Task:
    description: str
    total: float | None
    completed: float
    unit: str
    started: float
    first: float  # completed when the task started (a resumed pass counts only what it does itself)
    shown: float = field(default=-1.0)  # completed at the last line
    last_line: float = field(default=0.0)  # time of the last line (or of the start)


class PlainProgress:
    """The part of ``rich.progress.Progress`` the passes use (a context manager with ``add_task``, ``update``,
    ``advance``), writing a line such as ``vitscope tiny-vit: 120/500 images (24%), 12.3 images/s, about 31 s
    left`` to stderr at most every ``interval`` seconds, and a last line at the end when it wrote any.

    Args:
        interval: seconds between lines (default: :func:`interval_seconds`).
    """

    def __init__(self, interval: float | None = None) -> None:
        self.interval = interval_seconds() if interval is None else interval
        self.tasks: list[_Task] = []

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            for task in self.tasks:
                if task.shown >= 0 and task.shown != task.completed:
                    self._line(task, time.monotonic())

    def add_task(self, description: str, total: float | None = None, completed: float = 0, unit: str = "",
                 **fields: Any) -> int:
        now = time.monotonic()
        self.tasks.append(_Task(description, total, completed, unit, now, completed, last_line=now))
        return len(self.tasks) - 1

    def update(self, task_id: int, completed: float | None = None, advance: float | None = None, **fields: Any
               ) -> None:
        task = self.tasks[task_id]
        if completed is not None:
            task.completed = completed
        if advance is not None:
            task.completed += advance
        now = time.monotonic()
        if now - task.last_line >= self.interval and task.completed != task.shown:
            self._line(task, now)

    def advance(self, task_id: int, advance: float = 1) -> None:
        self.update(task_id, advance=advance)

    def _line(self, task: _Task, now: float) -> None:
        unit = f" {task.unit}" if task.unit else ""
        done = f"{task.completed:g}"
        if task.total:
            done += f"/{task.total:g}{unit} ({100 * task.completed / task.total:.0f}%)"
        else:
            done += unit
        elapsed = now - task.started
        rate = (task.completed - task.first) / elapsed if elapsed > 0 else 0.0
        parts = [done, f"{rate:.3g} {task.unit or 'items'}/s"]
        if task.total and task.completed < task.total:
            parts.append(f"{_duration((task.total - task.completed) / rate)} left" if rate > 0 else
                         "time left unknown")
        print(f"vitscope {task.description}: {', '.join(parts)}", file=sys.stderr, flush=True)
        task.shown, task.last_line = task.completed, now
