"""The output folder: checked before a pass, written through a staging folder, and tracked by a manifest.

``prepare_output`` runs before any image is read, so a wrong ``--out`` costs nothing. Files are written into a
staging folder inside the output folder and moved into place one by one with ``os.replace`` (a reader never
sees half a file). A manifest (``.vitscope-manifest.json``) lists what the last run wrote: the next run into the
same folder removes its predecessor's files that it does not write again (a different model's figures, say),
and never touches files it did not write.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path

from vitscope.atomic import remove_leftovers, staging_name, temporary_path
from vitscope.errors import VitscopeValueError
from vitscope.strict_json import dumps

__all__ = ["MANIFEST", "OutputError", "Staging", "prepare_output", "usable_folder"]

MANIFEST = ".vitscope-manifest.json"
STATE_FOLDER = ".vitscope-state"  # resumable state of an interrupted pass (vitscope.engine.state)


class OutputError(VitscopeValueError):
    """The output folder cannot be used (it is a file, or cannot be created or written)."""


def prepare_output(out: str | os.PathLike) -> Path:
    """Check that ``out`` can hold the outputs, creating it; call it before the pass.

    Raises:
        OutputError: ``out`` is a file, or cannot be created or written (one line).
        VitscopeRuntimeError: the report's vendored chart library is not the pinned file.
    """
    out = usable_folder(out)
    for folder in (out, out / STATE_FOLDER):  # a run killed while writing left these; its finished files are whole
        remove_leftovers(folder, stale_pids=frozenset({os.getpid()}))  # this process has written nothing yet
    from vitscope.report.assets import echarts_script

    echarts_script()  # a damaged install fails now, not after the pass when the report is rendered
    return out


def usable_folder(path: str | os.PathLike, option: str = "--out") -> Path:
    """``path`` created as a folder this process can write into, or one line saying why not.

    Args:
        path: the folder; option: the command-line option that named it (in the messages).

    Raises:
        OutputError: ``path`` is a file, or cannot be created or written.
    """
    path = Path(path).expanduser()
    what = "output folder" if option == "--out" else f"{option} folder"
    if path.exists() and not path.is_dir():
        raise OutputError(f"{option} {path} is a file; give a folder (it is created when missing)")
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
        were not rewritten, write the manifest; returns the published files."""
        last = list(last)
        written = self.files()
        for rel in [f for f in written if f not in last] + [f for f in last if f in written]:
            target = self.out / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self.root / rel, target)
        for rel in set(previous_files(self.out)) - set(written):
            stale = self.out / rel
            if stale.is_file() and self.out.resolve() in stale.resolve().parents:
                stale.unlink()
        manifest = temporary_path(self.out / MANIFEST)
        manifest.write_text(dumps({"files": written}, indent=1))
        os.replace(manifest, self.out / MANIFEST)
        self.discard()
        return written

    def discard(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
