"""Forked helper processes (loading workers, figure workers) end with the process that forked them.

Killed (``kill -9``, the OOM killer), a process runs no clean-up: its forked workers stay, blocked on a queue
nobody reads, holding the pipes of whoever reads its output (a script waiting for it waits for ever) and the lock
of its output folder, inherited (every rerun into the folder is refused).
"""

from __future__ import annotations

import ctypes
import os
import signal

__all__ = ["die_with_parent", "quiet_worker"]

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """In a forked worker: ask Linux to kill this process when the thread that forked it ends; end at once when
    ``parent`` (the forking process's pid, read before the fork) has already ended. Elsewhere nothing happens
    (vitscope forks workers on Linux only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: not Linux
        return
    if os.getppid() != parent:
        os._exit(1)


def quiet_worker(parent: int, stops: tuple[int, ...] = (signal.SIGINT,)) -> None:
    """In a forked worker: leave the ``stops`` signals to the main process, and end with it
    (:func:`die_with_parent`).

    A terminal's Ctrl-C reaches every process of the group: the main process reports it once (a worker would print
    its own traceback). Loading workers leave SIGTERM (a batch scheduler's, to the whole group) to it too, which
    stops after the batch in flight (a worker dying of it would fail that batch); a ``multiprocessing.Pool``'s
    workers must not, as the pool ends them with it: SIGTERM's default action then ends them quietly (the handler
    a command installs for itself, inherited, would raise in them).
    """
    for stop in stops:
        signal.signal(stop, signal.SIG_IGN)
    if signal.SIGTERM not in stops:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent(parent)
