"""Where row stores keep their spilled rows: this process's private folder (removed when it exits, one per root
given by :func:`private_rows_under`), and the folder rows go to when a store is pickled for another process
(:func:`exported_when_pickled`)."""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

from vitscope.atomic import process_alive

__all__ = ["export_folder", "exported_when_pickled", "is_private", "link_or_copy", "private_folder",
           "private_rows_under"]

_TEMP_DIRS: list[str] = []  # private folders: their rows do not outlive the process that made them
_MADE_BY: dict[str, int] = {}  # private folder -> the process that made it (only it removes the folder)
_PRIVATE_ROOTS: list[str] = []  # where private folders go (innermost last; none: the system's temporary folder)
_PRIVATE: dict[tuple[str | None, int], str] = {}  # (root, process) -> that process's private folder there
_EXPORT_TO: list[str] = []  # folders stores are exported to when pickled (innermost last)


@contextlib.contextmanager
def exported_when_pickled(folder: str | Path) -> Iterator[None]:
    """Inside, a pickled :class:`RowStore` (wherever it sits in the pickled object) writes its rows to one shard
    file under ``folder`` and pickles only that file's path: how processes hand each other rows through a
    folder they share instead of through a process group."""
    _EXPORT_TO.append(str(folder))
    try:
        yield
    finally:
        _EXPORT_TO.pop()


@contextlib.contextmanager
def private_rows_under(folder: str | Path) -> Iterator[None]:
    """Inside, stores without a ``workdir`` spill into one folder of this process under ``folder`` (a run puts it
    beside its state file: on that file system saving links rows instead of copying them, and rows never land
    in a RAM-backed ``/tmp``). Such folders that a killed process of this machine left there are removed first.
    """
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    host = _host()
    for stale in root.glob(f".vitscope-rows-{glob.escape(host)}-*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    _PRIVATE_ROOTS.append(str(root))
    try:
        yield
    finally:
        _PRIVATE_ROOTS.pop()


def _host() -> str:
    return "".join(c if c.isalnum() else "_" for c in socket.gethostname()) or "host"


def _cleanup_temp_dirs() -> None:
    for d in _TEMP_DIRS:
        if _MADE_BY.get(d) == os.getpid():  # never a folder a forked parent still uses
            shutil.rmtree(d, ignore_errors=True)


atexit.register(_cleanup_temp_dirs)


def export_folder() -> str | None:
    """The folder a store pickled now exports its rows to (innermost :func:`exported_when_pickled`), or None."""
    return _EXPORT_TO[-1] if _EXPORT_TO else None


def is_private(folder: str) -> bool:
    """Whether ``folder`` is a private folder of this process tree (its rows do not outlive the process)."""
    return folder in _TEMP_DIRS


def private_folder() -> str:
    """This process's folder for spilled rows (one a root, :func:`private_rows_under`), removed at exit."""
    root, pid = (_PRIVATE_ROOTS[-1] if _PRIVATE_ROOTS else None), os.getpid()
    folder = _PRIVATE.get((root, pid))
    if folder is None or not os.path.isdir(folder):
        if root is None:
            folder = tempfile.mkdtemp(prefix="vitscope-rows-")
        else:
            folder = str(Path(root) / f".vitscope-rows-{_host()}-{pid}")
            os.makedirs(folder, exist_ok=True)
        _PRIVATE[(root, pid)] = folder
        _MADE_BY[folder] = pid
        if folder not in _TEMP_DIRS:
            _TEMP_DIRS.append(folder)
    return folder


def link_or_copy(source: Path, target: Path) -> None:
    """Hard-link ``source`` to ``target``, or copy it when the file system cannot link (another device...)."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
