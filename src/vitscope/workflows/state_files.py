"""Resumable state of a command's passes, kept inside its output folder until every output is written."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vitscope.engine.state import Checkpoint, run_checkpoint
from vitscope.outputs.folder import STATE_FOLDER as STATE_DIR

__all__ = ["STATE_DIR", "checkpoint_for", "clear_state", "state_path"]


def state_path(out: Path, model_id: str) -> Path:
    """Where the resumable state of ``model_id``'s pass lives inside the output folder."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model_id).strip("._") or "model"
    return Path(out) / STATE_DIR / f"{safe}.pt"


def checkpoint_for(out: Path, model_id: str, backbone: Any, fingerprint: dict[str, Any], analyses: Sequence[Any],
                   *, resume: bool = True, every_seconds: float = 60.0, log: Callable[[str], None] | None = None,
                   **settings: Any) -> Checkpoint | None:
    """The Checkpoint of one model's pass (None when ``resume`` is off: any old state is then removed).

    ``settings`` (limit, strict, device, dtype) are keyed with the model, data and analyses.
    """
    path = state_path(out, model_id)
    if not resume:
        Checkpoint(path, {}).clear()  # the file and the rows it names
        return None
    return run_checkpoint(path, backbone, fingerprint, analyses, every_seconds=every_seconds, log=log, **settings)


def clear_state(out: Path) -> None:
    """Remove the state folder once every output is written."""
    shutil.rmtree(Path(out) / STATE_DIR, ignore_errors=True)
