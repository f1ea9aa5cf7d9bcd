"""One writer per output folder: a run holds an exclusive lock on its ``--out`` from before its pass to the end of
its writing, so that two runs started into one folder (a job array given one ``--out``) cannot mix their files or
throw away each other's saved state; the second is refused in one line.

The lock is ``flock`` on the folder itself: no file is left behind, and the kernel releases it when the process
ends, however it ends (``kill -9`` included). Under ``torchrun`` the writing process (rank 0) holds it. Where the
file system does not lock (some network file systems) runs go on unlocked, as before.
"""

from __future__ import annotations

import errno
import functools
import os
from collections.abc import Callable
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


class FolderBusyError(VitscopeValueError):
    """Another process is writing into the output folder."""


def hold_output(folder: Path, option: str = "--out") -> None:
    """Lock ``folder`` for this process (again: nothing more); the writing process alone locks under ``torchrun``.

    Raises:
        FolderBusyError: another process holds it.
    """
    from vitscope.engine.distributed import is_main_process

    key = folder.resolve()
    if fcntl is None or key in _HELD or not is_main_process():
        return
    fd = os.open(key, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(fd)
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise FolderBusyError(f"another vitscope run is writing into {option} {folder}: wait for it to finish "
                                  f"or give another {option}") from None
        return  # a file system that does not lock
    _HELD[key] = fd


def release_output(folder: Path) -> None:
    """Unlock ``folder`` if this process holds it."""
    fd = _HELD.pop(Path(folder).resolve(), None)
    if fd is not None:
        os.close(fd)  # closing the only descriptor releases the lock



def releasing_outputs(fn: Callable[P, T]) -> Callable[P, T]:
    """Decorator for a command's function: the folders the call locked are let go when it returns or raises (a
    failed call from a notebook would otherwise keep its ``--out`` locked until the kernel ends)."""

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        before = set(_HELD)
        try:
            return fn(*args, **kwargs)
        finally:
            for folder in set(_HELD) - before:
                release_output(folder)

    return call
