"""Save and resume a run's accumulator state (docs/architecture.md, "Declared state": state is saved and reloaded).

A :class:`Checkpoint` writes, every ``every_seconds`` (and when the user presses Ctrl-C, after the batch in
flight), the state of every analysis plus the dataset position reached. Re-running the same command loads
it and continues from that position; because batches are the same ranges of the dataset in the same order
and the state is restored exactly (float64 sums bit for bit), the results equal those of an uninterrupted
run. A state file is keyed by a digest of everything that decides the numbers (model weights and spec,
data fingerprint, analyses and their configuration, the files of analyses from outside vitscope, view, limit,
device, dtype, vitscope version; not the batch size, on which no number depends): a file written under
another key is ignored with a message, never merged.

Files are written atomically (temporary file + ``os.replace``) with ``torch.save`` of a tree of tensors,
numbers and strings (:mod:`~vitscope.engine.state_codec`), and read with ``torch.load(weights_only=True)``,
so loading a state file cannot run code.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vitscope.analyses.base import Analysis
from vitscope.analyses.grids import grid_of
from vitscope.atomic import named_os_error, temporary_path
from vitscope.cache.rowstore import private_rows_under
from vitscope.engine.state_codec import StateCodecError, decode, encode
from vitscope.errors import Terminated

__all__ = ["STOP_AFTER_ENV", "STOP_SIGNALS", "Checkpoint", "ResumePoint", "interrupt_guard", "remove_state",
           "restore_or_reset", "run_checkpoint", "run_key", "stop_exception"]

FORMAT = 1
#: Test hook: stop (as if interrupted by Ctrl-C) after this many batches of one process, state saved first.
STOP_AFTER_ENV = "VITSCOPE_STOP_AFTER_BATCHES"


@dataclass
class ResumePoint:
    """Where a saved run stopped: next dataset position, images fed so far, files skipped so far, and the images
    of every token grid so far (``"HxW"`` -> images)."""

    position: int
    seen: int
    skipped: list[tuple[str, str]] = field(default_factory=list)
    grids: dict[str, int] = field(default_factory=dict)


def _analysis_config(a: Analysis) -> dict[str, str]:
    """The constructor arguments of an analysis that decide what it computes, as strings."""
    return {k: repr(sorted(v) if isinstance(v, (set, frozenset)) else v) for k, v in sorted(a.keyed_params().items())}


def run_key(model_fingerprint: str, spec: dict[str, Any], data_fingerprint: dict[str, Any],
            analyses: Sequence[Analysis], **settings: Any) -> dict[str, Any]:
    """Everything that decides a run's numbers, as a JSON-able dict (its digest keys the state file).

    Args:
        model_fingerprint: digest of the model's weights; spec: its ``ModelSpec.to_dict()``.
        data_fingerprint: :func:`~vitscope.engine.provenance.data_fingerprint` of the dataset.
        analyses: the analyses (names, classes and constructor arguments are keyed; for analyses from outside
            vitscope also their module and the sha256 of its file, the code that makes their numbers).
        settings: limit, device, dtype, ... (JSON-able; not the batch size, on which no number depends).
    """
    from vitscope._version import __version__
    from vitscope.analyses.plugins import analysis_sources

    # vitscope's own code is keyed by its version; a plugin's file may change between a stop and its resume
    sources = [[s["module"], s["sha256"]] for s in analysis_sources(analyses)]
    return {
        "format": FORMAT,
        "vitscope": __version__,
        "model": model_fingerprint,
        "spec": spec,
        "data": data_fingerprint.get("digest"),
        "analyses": [{"name": a.name, "class": f"{type(a).__module__}.{type(a).__qualname__}",
                      "config": _analysis_config(a)} for a in analyses],
        **({"sources": sources} if sources else {}),  # keys of runs of vitscope's analyses stay as they were
        **settings,
    }


def run_checkpoint(path: str | os.PathLike, backbone: Any, data_fingerprint: dict[str, Any],
                   analyses: Sequence[Analysis], every_seconds: float = 60.0,
                   log: Callable[[str], None] | None = None, **settings: Any) -> Checkpoint:
    """The Checkpoint of a run of analyses, keyed by :func:`run_key`: what ``vitscope.run(..., resume=path)``
    keeps, and with it every command that runs analyses (they pass ``resume`` to :func:`vitscope.run`).

    Args:
        path: the state file.
        backbone: the model (its weights and spec are keyed).
        data_fingerprint: :func:`~vitscope.data.fingerprint.data_fingerprint` of the source.
        analyses: the analyses (names, classes and parameters are keyed).
        every_seconds: least time between two saves.
        log: receives one-line messages.
        settings: limit, strict, device, dtype (keyed).
    """
    from vitscope.models.digest import model_fingerprint

    key = run_key(model_fingerprint(backbone), backbone.spec.to_dict(), data_fingerprint, analyses, **settings)
    return Checkpoint(path, key, every_seconds=every_seconds, log=log)


def _key_text(key: dict[str, Any]) -> str:
    return json.dumps(key, sort_keys=True, default=str, separators=(",", ":"))


def _changed(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return sorted(k for k in set(old) | set(new) if _key_text({k: old.get(k)}) != _key_text({k: new.get(k)}))


class Checkpoint:
    """Resumable state of one run, kept in one file.

    Args:
        path: the state file (its folder is created on the first save).
        key: :func:`run_key` of this run.
        every_seconds: least time between two periodic saves (0: after every batch).
        log: called with one-line messages (resumed from..., ignored a state file...).
        stop_after: test hook: after this many batches, save and raise KeyboardInterrupt (default: the
            ``VITSCOPE_STOP_AFTER_BATCHES`` environment variable, if set).
    """

    def __init__(self, path: str | os.PathLike, key: dict[str, Any], every_seconds: float = 60.0,
                 log: Callable[[str], None] | None = None, stop_after: int | None = None) -> None:
        self.path = Path(path)
        self.key = key
        self.every_seconds = float(every_seconds)
        self.log = log or (lambda message: None)
        env = os.environ.get(STOP_AFTER_ENV)
        self.stop_after = stop_after if stop_after is not None else (int(env) if env else None)
        self.batches = 0
        self.saves = 0
        self.resumed_images = 0  # images the restored state already held
        self.settings: dict[str, Any] = {}  # how this part of the run reads (batch size, workers): saved with it
        self.earlier_parts: list[dict[str, Any]] = []  # how the parts before it read, from the restored state
        self._last_save = time.monotonic()

    def for_rank(self, rank: int, world: int) -> None:
        """Keep this process's state in a file of its own, keyed by its rank and the number of processes.

        A restart with the same number of processes continues rank by rank; with another number the saved
        files do not apply (each rank read other batches), which rank 0 says before starting over. One process
        keeps its file as it is named (and its key), and says the same of the files of several processes.
        """
        stem, suffix = self.path.stem, self.path.suffix
        others = {p.name.rsplit("-of-", 1)[1].removesuffix(suffix)
                  for p in self.path.parent.glob(f"{stem}.rank*-of-*{suffix}")}
        if world > 1 and self.path.exists():  # the state of a run of one process
            others.add("1")
        others = sorted(others - {str(world)}, key=lambda n: (len(n), n))
        if others and rank == 0:
            self.log(f"ignoring saved state of a run with {', '.join(others)} processes (this one has {world}); "
                     "starting over")
        if world == 1:
            return
        self.path = self.path.with_name(f"{stem}.rank{rank}-of-{world}{suffix}")
        self.key = {**self.key, "rank": rank, "processes": world}

    # ------------------------------------------------------------------ reading

    def restore(self, analyses: Sequence[Analysis]) -> ResumePoint | None:
        """Load the saved state into ``analyses`` when it was written under the same key.

        Returns:
            Where to continue, or None (no usable state: the analyses are left as they were).
        """
        if not self.path.exists():
            return None
        try:
            saved = torch.load(self.path, map_location="cpu", weights_only=True)
            old_key = json.loads(saved["key"])
        except Exception as err:  # a truncated or foreign file: start over rather than fail
            self.log(f"ignoring unreadable state file {self.path} ({type(err).__name__}); starting over")
            return None
        if saved["key"] != _key_text(self.key):
            changed = ", ".join(_changed(old_key, self.key)) or "key"
            self.log(f"ignoring saved state {self.path}: it belongs to a different run (changed: {changed}); "
                     "starting over")
            return None
        names = [a.name for a in analyses]
        if sorted(saved["analyses"]) != sorted(names):
            self.log(f"ignoring saved state {self.path}: it holds other analyses; starting over")
            return None
        try:
            states = {name: decode(saved["analyses"][name]) for name in names}
        except StateCodecError as err:
            self.log(f"ignoring saved state {self.path}: {err}; starting over")
            return None
        try:
            for a in analyses:
                a.reset()
                a.load_state_dict(states[a.name], copy=False)  # just decoded: nothing else holds it
        except (KeyError, ValueError, TypeError) as err:  # saved by a vitscope whose analyses kept other state
            for a in analyses:
                a.reset()
            self.log(f"ignoring saved state {self.path}: it does not fit these analyses ({err}); starting over")
            return None
        point = ResumePoint(int(saved["position"]), int(saved["seen"]), [tuple(s) for s in saved["skipped"]],
                            {str(k): int(n) for k, n in saved.get("grids", {}).items()})
        self.resumed_images = point.seen
        self.earlier_parts = [dict(part) for part in saved.get("parts", [])]
        self.log(f"resuming from saved state: {point.seen} images already done ({self.path})")
        return point

    # ------------------------------------------------------------------ writing

    def save(self, analyses: Sequence[Analysis], position: int, seen: int, skipped: Sequence[Any],
             grids: Mapping[str, int] | None = None) -> None:
        """Write the state atomically (temporary file in the same folder, then ``os.replace``).

        Row stores with rows on disk are linked into a folder beside the file (``<file>.rows-<id>``), which
        the file names; the folder of the previous save goes once the new file is in place, so the file on
        disk always names a complete folder.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        rows = self.path.with_name(f"{self.path.name}.rows-{uuid.uuid4().hex[:12]}")
        tmp = temporary_path(self.path)
        try:
            payload = {
                "format": FORMAT,
                "key": _key_text(self.key),
                "position": int(position),
                "seen": int(seen),
                "skipped": [[str(s.path), str(s.reason)] for s in skipped],
                "grids": {str(k): int(n) for k, n in (grids or {}).items()},
                "parts": self.parts(seen),
                "analyses": {a.name: encode(a.state_dict(), rows_folder=rows) for a in analyses},
            }
            with open(tmp, "wb") as f:
                torch.save(payload, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException as err:
            shutil.rmtree(rows, ignore_errors=True)
            named = named_os_error(err, self.path, tmp)  # a full disk: one line naming the state file
            if named is None:
                raise
            raise named from err
        finally:
            tmp.unlink(missing_ok=True)
        for old in _rows_folders(self.path):
            if old != rows:
                shutil.rmtree(old, ignore_errors=True)
        self.saves += 1
        self._last_save = time.monotonic()

    @contextlib.contextmanager
    def rows_beside(self) -> Iterator[None]:
        """Inside, row stores spill into the state file's folder (saving then links their rows instead of copying
        them); that folder, when made for this, goes again if the run ends without a state saved into it, so that
        a refused run leaves no empty state folder behind."""
        folder = self.path.parent
        made = not folder.exists()
        try:
            with private_rows_under(folder):
                yield
        finally:
            if made:
                with contextlib.suppress(OSError):  # not empty: a saved state or rows still in use keep it
                    folder.rmdir()

    def parts(self, seen: int) -> list[dict[str, Any]]:
        """How each part of the run read its images: the restored parts, then this one (``images``: those it added
        in this process, with its :attr:`settings`)."""
        return [*self.earlier_parts, {"images": int(seen) - self.resumed_images, **self.settings}]

    def after_batch(self, analyses: Sequence[Analysis], position: int, seen: int, skipped: Sequence[Any],
                    interrupted: int = 0, grids: Mapping[str, int] | None = None) -> None:
        """Called by the engine after every batch: save when due; stop when asked to (``interrupted``: the signal
        that asked, :func:`stop_exception`)."""
        self.batches += 1
        stop = interrupted or (self.stop_after is not None and self.batches >= self.stop_after)
        if stop or time.monotonic() - self._last_save >= self.every_seconds:
            self.save(analyses, position, seen, skipped, grids)
        if stop:
            self.log(f"stopped after {seen} images; state saved to {self.path}: run the same command to resume")
            raise stop_exception(interrupted)


def _rows_folders(path: Path) -> list[Path]:
    """The folders of rows that saved states of ``path`` name (one per save; the current file names the newest)."""
    return sorted(path.parent.glob(f"{glob.escape(path.name)}.rows-*"))


def remove_state(path: str | os.PathLike) -> None:
    """Delete a state file and the rows it names (a run told not to resume starts over)."""
    path = Path(path)
    path.unlink(missing_ok=True)
    for rows in _rows_folders(path):
        shutil.rmtree(rows, ignore_errors=True)


class _Guard:
    requested = 0  # the signal that asked the pass to stop (0: none)


#: the signals that stop a pass after its batch in flight: Ctrl-C, and a batch scheduler's SIGTERM
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def stop_exception(signum: int) -> KeyboardInterrupt:
    """What a stop asked by ``signum`` raises: :class:`~vitscope.errors.Terminated` for SIGTERM, else
    ``KeyboardInterrupt``."""
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


@contextlib.contextmanager
def interrupt_guard(enabled: bool = True) -> Iterator[_Guard]:
    """Turn the first Ctrl-C or SIGTERM into a request (``guard.requested``: the signal) so the batch in flight
    finishes and the state is saved; a second one interrupts at once. No-op outside the main thread or when
    disabled."""
    guard = _Guard()
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield guard
        return

    def handler(signum: int, frame: Any) -> None:
        if guard.requested:
            raise stop_exception(signum)
        guard.requested = signum

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield guard
    finally:
        for s, before in previous.items():
            signal.signal(s, before)


def restore_or_reset(checkpoint: Checkpoint | None, analyses: Sequence[Analysis], log: Any
                     ) -> tuple[int, int, dict[tuple[int, int], int]]:
    """Load saved state (and the files skipped before, into ``log``: a ``SkipLog``) when it matches, else start
    every analysis afresh (an instance given to an earlier run holds that run's state, whole or partial); returns
    ``(start position, seen, images per grid)``."""
    point = checkpoint.restore(analyses) if checkpoint is not None else None
    if point is None:
        for a in analyses:
            a.reset()
        return 0, 0, {}
    for path, reason in point.skipped:
        log.add(path, reason, warn=False)
    return point.position, point.seen, {grid_of(k): n for k, n in point.grids.items()}
