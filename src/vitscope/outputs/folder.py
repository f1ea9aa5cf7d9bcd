"""The output folder: checked before a pass, written through a staging folder, and tracked by a manifest.

``prepare_output`` runs before any image is read, so a wrong ``--out`` costs nothing. Files are written into a
staging folder inside the output folder and moved into place one by one with ``os.replace`` (a reader never
sees half a file). A manifest (``.vitscope-manifest.json``) lists what the last run wrote: the next run into the
same folder removes its predecessor's files that it does not write again (a different model's figures, say),
and never touches files it did not write. A publish that fails puts the previous run's files back, and one run at
a time writes into a folder (:mod:`vitscope.outputs.lock`).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path

from vitscope.atomic import OUTPUT_MANIFEST, remove_leftovers, staging_name, write_text_atomic
from vitscope.errors import VitscopeValueError
from vitscope.outputs.lock import hold_output
from vitscope.strict_json import dumps

__all__ = ["MANIFEST", "OutputError", "Staging", "check_output", "prepare_output", "usable_folder"]

MANIFEST = OUTPUT_MANIFEST
STATE_FOLDER = ".vitscope-state"  # resumable state of an interrupted pass (vitscope.engine.state)
#: the subfolders the writer fills (the others it writes, it makes itself)
SUBFOLDERS = ("tables", "arrays", "figures", "charts", STATE_FOLDER)


class OutputError(VitscopeValueError):
    """The output folder cannot be used (it is a file, or cannot be created or written)."""


def prepare_output(out: str | os.PathLike) -> Path:
    """Check that ``out`` can hold the outputs, creating it; call it before the pass.

    The folder stays locked for this process (:mod:`vitscope.outputs.lock`) until its outputs are written.

    Raises:
        OutputError: ``out`` is a file, or cannot be created or written (one line).
        FolderBusyError: another run is writing into ``out``.
        VitscopeRuntimeError: the report's vendored chart library is not the pinned file.
    """
    out = usable_folder(out)
    for name in SUBFOLDERS:  # before the pass: the writer would refuse them only after it
        _refuse_link(out, out / name)
    hold_output(out)  # before the leftovers go: a run still writing here has its own
    for folder in (out, out / STATE_FOLDER):  # a run killed while writing left these; its finished files are whole
        remove_leftovers(folder, stale_pids=frozenset({os.getpid()}))  # this process has written nothing yet
    from vitscope.report.assets import echarts_script

    echarts_script()  # a damaged install fails now, not after the pass when the report is rendered
    return out


def check_output(out: str | os.PathLike | None, option: str = "--out") -> None:
    """Refuse, before any work and without creating anything, an ``out`` that cannot become the output folder: a
    file, a path under a file, or a place this process cannot write (the folder is made later, once the input is
    known good: :func:`prepare_output`). None passes (a run that writes nothing).

    Raises:
        OutputError: as :func:`usable_folder` would, one line.
    """
    if out is None:
        return
    path = Path(out).expanduser()
    what = _what(option)
    if path.is_symlink() and not path.exists():
        raise OutputError(f"{option} {path} is a link to nothing; give a folder (it is created when missing)")
    if path.exists() and not path.is_dir():
        raise OutputError(f"{option} {path} is a file; give a folder (it is created when missing)")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise OutputError(f"cannot create the {what} {path}: {existing} is a file")
    if not os.access(existing, os.W_OK):
        raise OutputError(f"cannot write into the {what} {path}" if existing == path else
                          f"cannot create the {what} {path}: Permission denied")


def _what(option: str) -> str:
    return "output folder" if option == "--out" else f"{option} folder"


def usable_folder(path: str | os.PathLike, option: str = "--out") -> Path:
    """``path`` created as a folder this process can write into, or one line saying why not.

    Args:
        path: the folder; option: the command-line option that named it (in the messages).

    Raises:
        OutputError: ``path`` is a file, or cannot be created or written.
    """
    check_output(path, option)  # a file, a link to nothing, a path under a file: the same words as before any work
    path, what = Path(path).expanduser(), _what(option)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(f"cannot create the {what} {path}: {err.strerror or err}") from None
    if not os.access(path, os.W_OK):
        raise OutputError(f"cannot write into the {what} {path}")
    return path


def previous_files(out: Path) -> list[str]:
    """The files (relative paths) the last run wrote into ``out``, from its manifest."""
    try:
        doc = json.loads((out / MANIFEST).read_text())
        return [str(f) for f in doc.get("files", [])]
    except (OSError, ValueError):
        return []


class Staging:
    """A staging folder inside ``out``: write there, then :meth:`publish` moves every file into place."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.root = out / staging_name(uuid.uuid4().hex)  # the pid: leftovers of a killed run
        self.root.mkdir(parents=True)

    def path(self, rel: str) -> Path:
        """Where to write the file that will live at ``out/rel``."""
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def files(self) -> list[str]:
        """Relative paths of everything written so far."""
        return sorted(p.relative_to(self.root).as_posix() for p in self.root.rglob("*") if p.is_file())

    def publish(self, last: Iterable[str] = ()) -> list[str]:
        """Move every staged file into ``out`` (``last`` after the others), drop files of the previous run that
        were not rewritten, write the manifest; returns the published files.

        All or nothing: the files it replaces or drops are kept aside (a hard link) and put back if a move or the
        manifest fails (a read-only subfolder, a full disk, Ctrl-C), so ``out`` then holds the previous run's files
        and manifest as they were. Killed (nothing runs), every file keeps a final name: the old run's or the new."""
        last = list(last)
        written = self.files()
        aside = self.out / staging_name(uuid.uuid4().hex)  # a leftover of this process if it is killed meanwhile
        done: list[tuple[Path, Path | None]] = []  # (a target changed, a link to its previous file or None)
        for rel in written:  # a linked subfolder would take the file elsewhere (a shared results folder)
            for folder in reversed(Path(rel).parents[:-1]):
                _refuse_link(self.out, self.out / folder)
        try:
            for rel in [f for f in written if f not in last] + [f for f in last if f in written]:
                target = self.out / rel
                previous = _link_aside(target, aside / rel)  # the target itself stays until it is replaced
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(self.root / rel, target)
                done.append((target, previous))
            for rel in set(previous_files(self.out)) - set(written):
                stale = self.out / rel
                if stale.is_file() and self.out.resolve() in stale.resolve().parents:
                    (aside / rel).parent.mkdir(parents=True, exist_ok=True)
                    os.replace(stale, aside / rel)
                    done.append((stale, aside / rel))
            write_text_atomic(self.out / MANIFEST, dumps({"files": written}, indent=1))  # the old one until then
        except BaseException:
            for target, previous in reversed(done):
                if previous is None:
                    target.unlink(missing_ok=True)
                else:
                    os.replace(previous, target)
            raise
        finally:
            shutil.rmtree(aside, ignore_errors=True)
            self.discard()
        return written

    def discard(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _refuse_link(out: Path, folder: Path) -> None:
    """Refuse a subfolder of ``out`` that is a link: outputs are written inside ``out`` only.

    Raises:
        OutputError: ``folder`` is a link.
    """
    if folder.is_symlink():
        raise OutputError(f"{folder} is a link (to {os.readlink(folder)}): vitscope writes its outputs inside the "
                          f"output folder {out} only; remove the link or give another --out")


def _link_aside(target: Path, place: Path) -> Path | None:
    """A second name ``place`` for the file ``target`` (a hard link, else a copy); None when there is no file."""
    if not target.is_file():
        return None
    place.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(target, place)
    except OSError:  # a file system without hard links, or a target on another one (a mounted subfolder)
        shutil.copy2(target, place)
    return place
