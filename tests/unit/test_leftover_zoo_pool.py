"""The workers of a parallel ``zoo build`` end when the process that started them ends (``kill -9`` of the
command), instead of training on and writing into the zoo unwatched."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

import pytest

import vitscope.zoo.build as zoo_build


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie nobody has reaped yet counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def _death_signal() -> int:
    """The signal Linux sends this process when its parent ends (0: none)."""
    import ctypes

    sig = ctypes.c_int(0)
    ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG
    return sig.value


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's parent-death signal is Linux's")
def test_a_worker_dies_with_its_parent() -> None:
    ready_r, ready_w = os.pipe()
    parent = os.fork()
    if parent == 0:  # the parent of the worker: starts it, says its id, waits to be killed
        try:
            worker = os.fork()
            if worker == 0:
                zoo_build._die_with_parent()
                os.write(ready_w, f"ready {_death_signal()}\n".encode())
                time.sleep(30)
                os._exit(0)
            os.write(ready_w, f"{worker}\n".encode())
            time.sleep(30)
        finally:
            os._exit(0)
    os.close(ready_w)
    worker = None
    try:
        with os.fdopen(ready_r) as ready:
            lines = {ready.readline().strip(), ready.readline().strip()}
        assert f"ready {int(signal.SIGKILL)}" in lines  # the kernel's doing, not the watching thread's
        worker = int(next(line for line in lines if not line.startswith("ready")))
        os.kill(parent, signal.SIGKILL)
        os.waitpid(parent, 0)
        deadline = time.monotonic() + 5
        while not _gone(worker) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _gone(worker)
    finally:
        for pid in (parent, worker):
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(parent, os.WNOHANG)


def test_without_the_kernels_help_a_thread_ends_the_worker_when_its_parent_changes(monkeypatch) -> None:
    parents = iter([41, 41, 41, 1])
    exits: list[int] = []

    class Exited(Exception):
        pass

    def exit_(code: int) -> None:
        exits.append(code)
        raise Exited

    monkeypatch.setattr(zoo_build.os, "getppid", lambda: next(parents))
    monkeypatch.setattr(zoo_build.os, "_exit", exit_)
    monkeypatch.setattr(zoo_build.time, "sleep", lambda s: None)
    with pytest.raises(Exited):
        zoo_build._watch_parent(41)
    assert exits == [1]


def test_the_watching_thread_starts_where_the_kernel_cannot_help(monkeypatch) -> None:
    started: list[tuple] = []

    class Thread:
        def __init__(self, target, args, name, daemon) -> None:
            started.append((target, args, daemon))

        def start(self) -> None:
            pass

    monkeypatch.setattr(zoo_build, "_kernel_kills_orphan", lambda: False)
    monkeypatch.setattr(zoo_build.threading, "Thread", Thread)
    zoo_build._die_with_parent()
    assert started == [(zoo_build._watch_parent, (os.getppid(),), True)]


def test_the_pool_of_a_parallel_build_starts_its_workers_with_it(monkeypatch) -> None:
    import concurrent.futures

    seen: dict = {}

    class Pool:
        def __init__(self, **kwargs) -> None:
            seen.update(kwargs)
            raise RuntimeError("no pool needed")

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", Pool)
    monkeypatch.setattr(zoo_build, "longest_first", lambda names, directory: names)
    with pytest.raises(RuntimeError, match="no pool needed"):
        next(zoo_build.build_many(["a", "b"], jobs=2))
    assert seen["initializer"] is zoo_build._die_with_parent
