"""Paths the command line is given, checked before any work: a folder it will write, an image file it will read,
a dataset root; each refusal is one line naming the option."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from vitscope.errors import VitscopeFileNotFoundError, VitscopeUsageError, VitscopeValueError

__all__ = ["existing_folder", "image_files", "missing_data_root", "writable_folder"]


def writable_folder(option: str, path: Path, keep: bool = True) -> Path:
    """``path`` as a folder the command may write (:func:`vitscope.outputs.folder.usable_folder`), checked before
    any work (a command that trains first would otherwise fail only when it saves).

    Args:
        keep: leave the folder created; False removes the folders this check created (a command that may still
            refuse its input writes nothing then), unless torchrun's processes check the same folder at once.

    Raises:
        OutputError: ``path`` is a file, or cannot be created or written.
    """
    from vitscope.outputs.folder import usable_folder

    path = Path(path).expanduser()
    missing = [p for p in (path, *path.parents) if not p.exists()]
    try:
        return usable_folder(path, option)
    finally:
        if not keep and int(os.environ.get("WORLD_SIZE", "1")) == 1:
            for folder in (f for f in missing if f.is_dir()):  # deepest first
                folder.rmdir()


def existing_folder(option: str, path: Path) -> Path:
    """``path``, a folder that must exist (one the command only reads).

    Raises:
        VitscopeUsageError: it is missing or a file.
    """
    if not path.exists():
        raise VitscopeUsageError(f"{option} {path} not found; give an existing folder")
    if not path.is_dir():
        raise VitscopeUsageError(f"{option} {path} is a file; give a folder")
    return path


def image_files(paths: Iterable[Path]) -> None:
    """Refuse a missing image or a folder where image files are expected.

    Raises:
        VitscopeFileNotFoundError: a path names nothing.
        VitscopeValueError: a path is a folder.
    """
    for p in paths:
        if p.is_dir():
            raise VitscopeValueError(f"{p} is a folder; give image files (e.g. {p}/*.jpg)")
        if not p.is_file():
            raise VitscopeFileNotFoundError(f"image {p} not found")


def missing_data_root(option: str, spec: str | None, on_disk: Iterable[str]) -> None:
    """Refuse a dataset (``ROOT`` or ``ROOT::FORMAT[:SPLIT]``, FORMAT one of ``on_disk``) whose root names nothing,
    naming the option (``--data``, ``--test-data``) rather than a format that cannot be told.

    Raises:
        VitscopeFileNotFoundError: the root does not exist.
    """
    from vitscope.data.load import parse_data

    if not spec:
        return
    root, fmt = parse_data(spec)[:2] if "::" in spec else (spec, None)
    if root and (not fmt or fmt in set(on_disk)) and not Path(root).expanduser().exists():
        raise VitscopeFileNotFoundError(f"{option} {spec}: {root} not found" if root != spec else
                                        f"{option} {root} not found")
