"""One writer per output folder: a run holds an exclusive lock on its ``--out`` from before its pass to the end of
its writing, so that two runs started into one folder (a job array given one ``--out``) cannot mix their files or
throw away each other's saved state; the second is refused in one line.

The lock is ``flock`` on the folder itself: no file is left behind, and the kernel releases it when the process
ends, however it ends (``kill -9`` included). A command's call holds it (:func:`releasing_outputs`): its pass, its
writing and the removal of its saved state; a second call into the folder, from another process or another thread,
is refused. Under ``torchrun`` the writing process (rank 0) holds it. Where the file system does not lock (some
network file systems) runs go on unlocked.
"""

from __future__ import annotations

import errno
import functools
import os
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path
from typing import ParamSpec, TypeVar

from vitscope.errors import VitscopeValueError

__all__ = ["FolderBusyError", "hold_output", "release_output", "releasing_outputs"]

try:
    import fcntl
except ImportError:  # not a POSIX system: no lock
    fcntl = None  # type: ignore[assignment]

P = ParamSpec("P")
T = TypeVar("T")

#: the folders this process holds: resolved path -> the descriptor the lock is on
_HELD: dict[Path, int] = {}

#: the folders locked outside any command's call (``prepare_output`` called alone): the next call into one takes it
_LOOSE: set[Path] = set()

#: the folders the outermost command call of this thread (or task) locked; None outside a command's call
_CALL: ContextVar[list[Path] | None] = ContextVar("vitscope_output_call", default=None)


class FolderBusyError(VitscopeValueError):
    """Another run is writing into the output folder."""


def _busy(folder: Path, option: str) -> FolderBusyError:
    return FolderBusyError(f"another vitscope run is writing into {option} {folder}: wait for it to finish or give "
                           f"another {option}")


def hold_output(folder: Path, option: str = "--out") -> None:
    """Lock ``folder`` for the command call under way (:func:`releasing_outputs`), which lets it go when it ends;
    again in the same call: nothing more. A folder locked outside any command's call (``prepare_output`` called
    alone) is taken over by the next call into it, which then lets it go. In a distributed run the writing
    process (rank 0) alone locks.

    Raises:
        FolderBusyError: another process holds it, or another call of this process (another thread).
    """
    key, call = folder.resolve(), _CALL.get()
    if fcntl is None or _other_rank():
        return
    if key in _HELD:
        if key in _LOOSE and call is not None:  # taken outside any call: this call lets it go
            _LOOSE.discard(key)
            call.append(key)
        elif key not in _LOOSE and (call is None or key not in call):  # another call's: another thread's run
            raise _busy(folder, option)
        return
    fd = os.open(key, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(fd)
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise _busy(folder, option) from None
        return  # a file system that does not lock
    _HELD[key] = fd
    if call is not None:
        call.append(key)
    else:
        _LOOSE.add(key)


def _other_rank() -> bool:
    """Whether this process is a distributed run's process other than rank 0 (rank 0 writes and locks)."""
    import torch.distributed as dist

    from vitscope.engine.distributed import in_torchrun, is_main_process

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() != 0
    return in_torchrun() and not is_main_process()


def release_output(folder: Path) -> None:
    """Unlock ``folder`` if this process holds it."""
    _LOOSE.discard(Path(folder).resolve())
    fd = _HELD.pop(Path(folder).resolve(), None)
    if fd is not None:
        os.close(fd)  # closing the only descriptor releases the lock


def releasing_outputs(fn: Callable[P, T]) -> Callable[P, T]:
    """Decorator for a command's function: the folders its call locks stay locked until the outermost such call
    ends (a command's writing and the removal of its saved state included), then are let go, whether it returned
    or raised (a failed call from a notebook would otherwise keep its ``--out`` locked until the kernel ends).
    Calls in other threads keep their own."""

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        if _CALL.get() is not None:  # inside a command's call: the outermost one lets go
            return fn(*args, **kwargs)
        taken: list[Path] = []
        token = _CALL.set(taken)
        try:
            return fn(*args, **kwargs)
        finally:
            _CALL.reset(token)
            for folder in taken:
                release_output(folder)

    return call
