"""The rate column of the terminal's progress bars: ``29 images/s``, as the plain lines say it."""

from __future__ import annotations

from rich.progress import ProgressColumn, Task
from rich.text import Text

__all__ = ["RateColumn"]


class RateColumn(ProgressColumn):
    """Items per second of a task (rich's recent-speed estimate), in the unit its ``unit`` field names."""

    def render(self, task: Task) -> Text:
        unit = task.fields.get("unit") or "items"
        speed = task.finished_speed or task.speed
        return Text(f"{speed:.3g} {unit}/s" if speed else f"- {unit}/s", style="progress.data.speed")
