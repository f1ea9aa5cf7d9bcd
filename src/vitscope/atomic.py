"""Write a file so that a reader never sees half of it: a temporary file in the same folder, then ``os.replace``."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Collection, Iterator
from pathlib import Path

__all__ = ["OUTPUT_MANIFEST", "atomic_path", "named_os_error", "process_alive", "remove_leftovers",
           "remove_leftovers_under", "staging_name", "temporary_path", "write_text_atomic"]

#: in every temporary name, so that cleaning a folder never touches a user's own ``.x.<number>.tmp`` files
MARKER = "vitscope"

#: the list of files a run wrote into its output folder (vitscope.outputs.folder); here so that data readers below
#: the writer can tell an output folder's files from images
OUTPUT_MANIFEST = ".vitscope-manifest.json"


def temporary_path(path: str | os.PathLike) -> Path:
    """This process's temporary name for ``path``: ``.<stem>.vitscope-<pid>.tmp<suffix>`` in the same folder
    (the suffix kept, so writers that infer the format from it still do)."""
    path = Path(path)
    return path.with_name(f".{path.stem}.{MARKER}-{os.getpid()}.tmp{path.suffix}")


def staging_name(token: str) -> str:
    """The name of this process's staging folder: ``.vitscope-staging-<pid>-<token>`` (``token``: hex digits)."""
    return f".{MARKER}-staging-{os.getpid()}-{token}"


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside ``path`` (same suffix, so writers that infer the format from it still do), moved
    onto ``path`` when the block ends without an error and removed otherwise; the folder is created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    try:
        yield tmp
        if tmp.is_file():  # the mode open() gives: some writers (safetensors) create their files private
            os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as err:
        named = named_os_error(err, path, tmp)
        if named is None:
            raise
        raise named from err
    finally:
        tmp.unlink(missing_ok=True)


def named_os_error(err: BaseException, path: str | os.PathLike, tmp: str | os.PathLike | None = None) -> OSError | None:
    """The system's refusal behind a failed write, naming the file the user asked for.

    A write to an open file (a full disk) raises an ``OSError`` that names no file, and a writer that wraps the
    file (torch's zip writer) turns it into a ``RuntimeError`` whose chain holds it; either way the one-line
    message should say which file could not be written.

    Args:
        err: what the write raised.
        path: the destination the user knows; tmp: its temporary name, replaced by ``path`` where it is named.

    Returns:
        ``OSError(errno, strerror, path)`` (the class its errno gives: ``PermissionError``, ...) when ``err`` is, or
        chains, an ``OSError`` with an errno that names no file or ``tmp``; that ``OSError`` itself when it names
        another file and ``err`` wraps it; None when ``err`` should propagate as it is.
    """
    cause = _os_error_in_chain(err)
    if cause is None or cause.errno is None:
        return None
    named = cause.filename is None or (tmp is not None and os.fspath(cause.filename) == os.fspath(tmp))
    if named:
        return OSError(cause.errno, cause.strerror, os.fspath(path))
    if cause is err:
        return None  # it names its own file already
    return OSError(cause.errno, cause.strerror, cause.filename, None, cause.filename2)


def _os_error_in_chain(err: BaseException) -> OSError | None:
    """``err`` when it is an ``OSError``, else the first ``OSError`` among a ``RuntimeError``'s causes and contexts."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError):
            return current
        if not isinstance(current, RuntimeError):
            return None  # an interrupt or a bug that happened during a failed write stays what it is
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _umask() -> int:
    """This process's umask (read by setting it, then setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (its folder is created); returns the path."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


#: :func:`temporary_path` and :func:`staging_name`; nothing without the marker matches
_LEFTOVER = re.compile(rf"^\.(?:.+\.{MARKER}-(?P<pid>\d+)\.tmp(?:\.[^.]+)?"
                       rf"|{MARKER}-staging-(?P<owner>\d+)-[0-9a-f]+)$")


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine is running (a process of another user counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_leftovers(folder: str | os.PathLike, stale_pids: frozenset[int] = frozenset(),
                     keep: Collection[str] = ()) -> list[str]:
    """Remove the temporary files and staging folders that a killed process (``kill -9``, power loss) left in
    ``folder``; those of a process still running on this machine are kept. Returns the names removed.

    Args:
        folder: where to look (not recursively).
        stale_pids: process ids whose leftovers go even though such a process runs: the caller's own id before
            it writes anything (a container restarts its command with the same id every time).
        keep: names kept whatever their process: those this process is writing now (read as each name is met,
            so a collection that the writers update as they go may be passed).

    Processes are told apart by their id on this machine: two machines writing into one shared folder at the
    same time are not supported (nor is that safe for the outputs themselves).
    """
    folder = Path(folder)
    removed = []
    if not folder.is_dir():
        return removed
    for entry in folder.iterdir():
        match = _LEFTOVER.match(entry.name)
        if match is None or entry.name in keep:
            continue
        try:
            pid = int(match.group("pid") or match.group("owner"))
            live = pid not in stale_pids and process_alive(pid)
        except (OverflowError, ValueError):  # not an id this machine could have given
            live = False
        if live:
            continue
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry.name)
    return removed


def remove_leftovers_under(root: str | os.PathLike, stale_pids: frozenset[int] = frozenset()) -> list[str]:
    """:func:`remove_leftovers` in ``root`` and every folder under it (links not followed); returns the paths
    removed, relative to ``root``.

    Args:
        root: the top of the tree (nothing happens when it is not a folder).
        stale_pids: as for :func:`remove_leftovers`.
    """
    removed = []
    for folder, subfolders, _ in os.walk(root):
        gone = remove_leftovers(folder, stale_pids)
        subfolders[:] = [name for name in subfolders if name not in gone]  # a removed staging folder
        removed.extend(os.path.relpath(os.path.join(folder, name), root) for name in gone)
    return removed
