"""Resumable state of a command's passes, kept inside its output folder until every output is written.

A command hands :func:`vitscope.run` the state file (``resume=``); the run builds its checkpoint from it, keyed by
everything that decides the numbers, as it does for a library call.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from vitscope.engine.state import remove_state
from vitscope.outputs.folder import STATE_FOLDER as STATE_DIR

__all__ = ["STATE_DIR", "clear_state", "resume_from", "state_path"]


def state_path(out: Path, model_id: str) -> Path:
    """Where the resumable state of ``model_id``'s pass lives inside the output folder."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model_id).strip("._") or "model"
    return Path(out) / STATE_DIR / f"{safe}.pt"


def resume_from(out: Path, model_id: str, resume: bool) -> Path | None:
    """The state file of ``model_id``'s pass in ``out``, for :func:`vitscope.run`'s ``resume``; None when
    ``resume`` is off: any state an earlier run left is then removed and the pass keeps none."""
    path = state_path(out, model_id)
    if resume:
        return path
    remove_state(path)  # the file and the rows it names
    return None


def clear_state(out: Path) -> None:
    """Remove the state folder once every output is written."""
    shutil.rmtree(Path(out) / STATE_DIR, ignore_errors=True)
