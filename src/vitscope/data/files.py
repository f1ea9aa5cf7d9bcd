"""``ImageFiles``: images from a folder (recursive), a list of paths, or a text file listing them."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from vitscope.atomic import OUTPUT_MANIFEST
from vitscope.data.images import (
    IMAGE_EXTENSIONS,
    DatasetNotFoundError,
    EmptyDatasetError,
    PathLike,
    load_rgb,
    one_line,
)
from vitscope.data.source import Source
from vitscope.errors import VitscopeValueError

__all__ = ["ImageFiles"]

#: the label rules of plain images (results.json ``data.label_rule``)
NO_LABELS = "none: plain image files carry no labels"
GIVEN_LABELS = "given beside the paths (integers, no class names)"


#: files a plain image source cannot read, and the format that does
_NOT_IMAGES = {".tar": "a tar archive: read WebDataset shards with --data '{0}::webdataset' (or a brace pattern)",
               ".parquet": "a Parquet file: read Hugging Face datasets with --data '{0}::hf'",
               ".arrow": "an Arrow file: read a Hugging Face dataset saved to disk with --data FOLDER::hf"}


def _other_format(source: Any) -> str:
    """``; it holds ...`` when a folder without images holds the files of a format read by name (tar shards, a
    Hugging Face dataset)."""
    try:
        folder = Path(os.fspath(source))
        if not folder.is_dir():
            return ""
        shards = sorted(p.name for p in folder.glob("*.tar"))
        if shards:
            held = shards[0] if len(shards) == 1 else f"{shards[0]} ... {shards[-1]}"
            return (f"; it holds .tar files ({held}): read them as WebDataset shards with "
                    f"--data '{folder}::webdataset' (or a brace pattern of shards)")
        if any(folder.glob("dataset_info.json")) or any(folder.glob("dataset_dict.json")) or any(
                folder.rglob("*.parquet")):
            return f"; it holds a Hugging Face dataset: read it with --data '{folder}::hf'"
    except (TypeError, OSError):
        pass
    return ""


def _scan_folder(root: Path, extensions: tuple[str, ...]) -> list[str]:
    """Recursively list files under ``root`` whose suffix matches, sorted by relative path.

    Linked folders are followed (datasets are often assembled from links), each real folder once, so a link
    loop ends; a broken link with an image suffix is listed, so that it is reported as skipped, not lost.
    Hidden files and folders (a leading dot) are skipped: they are a writer's temporary files, macOS's ``._*``
    resource forks or tools' state, never the user's images. So are the files a vitscope run wrote into a folder
    (those its output manifest lists): an output folder inside the data folder holds figures, not data.
    """
    found: list[Path] = []
    seen: set[tuple[int, int]] = set()
    outputs: set[Path] = set()
    for folder, subfolders, files in os.walk(root, followlinks=True):
        info = os.stat(folder)
        if (info.st_dev, info.st_ino) in seen:
            subfolders[:] = []
            continue
        seen.add((info.st_dev, info.st_ino))
        subfolders[:] = sorted(d for d in subfolders if not d.startswith("."))
        if OUTPUT_MANIFEST in files:  # walked top-down: known before the folders it lists files of
            outputs.update(Path(folder) / rel for rel in output_files(Path(folder) / OUTPUT_MANIFEST))
        found.extend(Path(folder) / f for f in files
                     if os.path.splitext(f)[1].lower() in extensions and not f.startswith("."))
    if outputs:
        found = [p for p in found if p not in outputs]
    found.sort(key=lambda p: p.relative_to(root).as_posix())
    return [str(p) for p in found]


def output_files(manifest: Path) -> list[str]:
    """The files (relative to its folder) that a vitscope output manifest lists; none when it cannot be read as
    one (the folder is then read as any other)."""
    try:
        doc = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, list):
        return []
    return [os.path.normpath(f) for f in files if isinstance(f, str) and f and not os.path.isabs(f)]


def _read_list_file(list_file: Path) -> list[str]:
    """Read one path per line; skip blank and ``#`` lines; resolve relative to the file's folder."""
    entries = (line.strip() for line in list_file.read_text(encoding="utf-8-sig").splitlines())
    paths = [Path(e).expanduser() for e in entries if e and not e.startswith("#")]
    return [os.path.normpath(p if p.is_absolute() else list_file.parent / p) for p in paths]


def _common_root(paths: Sequence[str]) -> Path | None:
    """Deepest folder containing every path, or ``None`` if there is none."""
    try:
        return Path(os.path.commonpath([os.path.abspath(os.path.dirname(p) or ".") for p in paths]))
    except ValueError:  # empty list, or paths on different drives
        return None


class ImageFiles(Source):
    """Images from a folder (recursive), a list of paths, or a text file listing one path per line.

    Args:
        source: a folder (searched recursively, extensions matched case-insensitively, paths sorted), a ``.txt``
            file listing paths (relative ones resolved against its folder; blank and ``#`` lines ignored), a
            single image file, or a list/tuple of paths.
        strict: :meth:`get` raises on unreadable files instead of skipping them.
        extensions: suffixes that count as images when scanning a folder.
        labels: optional class label per path (``targets["label"]``; -1 = unknown).
        name: what to call the data in outputs (default: the folder or list file's name).

    Raises:
        DatasetNotFoundError: ``source`` does not exist (also an ``EmptyDatasetError`` and a ``FileNotFoundError``).
        EmptyDatasetError: no candidate files.
    """

    def __init__(self, source: PathLike | Sequence[PathLike], strict: bool = False,
                 extensions: Sequence[str] = IMAGE_EXTENSIONS, labels: Sequence[int] | None = None,
                 name: str | None = None) -> None:
        super().__init__(strict=strict)
        self.extensions = tuple(e.lower() if e.startswith(".") else f".{e.lower()}" for e in extensions)
        if isinstance(source, (list, tuple)):
            self.paths = [os.fspath(p) for p in source]
            self.name, self.source = "files", f"list of {len(self.paths)} paths"
            self.format = "paths"
            self._root = _common_root(self.paths)
            where = "the given path list"
        else:
            where = self._init_from_path(Path(os.fspath(source)).expanduser())
        if not self.paths:
            raise EmptyDatasetError(one_line(f"no images found in {where}{_other_format(source)}"))
        if labels is not None and len(labels) != len(self.paths):
            raise VitscopeValueError(f"{len(labels)} labels for {len(self.paths)} paths")
        self._labels = None if labels is None else np.asarray(labels, dtype=np.int64)
        self.name = name or self.name

    def _init_from_path(self, src: Path) -> str:
        """Set ``paths``, ``name``, ``source`` and the fingerprint root; return a 'where' phrase."""
        if not src.exists():
            raise DatasetNotFoundError(one_line(f"image source not found: {src}"))
        self.source = str(src)
        self.format = "folder" if src.is_dir() else "paths"  # a list file or one image: paths all the same
        if src.is_dir():
            self.name, self._root = src.resolve().name or str(src), src
            self.paths = _scan_folder(src, self.extensions)
            return f"folder {src} (searched recursively for {', '.join(self.extensions)}, any case)"
        self.name, self._root = src.stem, src.parent
        if src.suffix.lower() in _NOT_IMAGES:
            raise VitscopeValueError(f"{src} is not an image but {_NOT_IMAGES[src.suffix.lower()].format(src)}")
        if src.suffix.lower() == ".txt":
            self.paths = _read_list_file(src)
            return f"list file {src} (it has no path entries)"
        self.paths = [str(src)]
        return str(src)

    def load(self, i: int) -> Image.Image:
        return load_rgb(self.paths[i])

    def targets(self, i: int) -> dict[str, Any]:
        if self._labels is None or self._labels[i] < 0:
            return {}
        return {"label": int(self._labels[i])}

    def labels(self) -> np.ndarray:
        if self._labels is None:
            return super().labels()
        return self._labels.copy()

    def fingerprint_files(self) -> tuple[Sequence[str], Path] | None:
        return self.paths, self._root or Path(".")

    def memory_digest(self) -> str | None:
        return None if self._labels is None else hashlib.sha256(self._labels.tobytes()).hexdigest()

    def describe(self) -> dict[str, Any]:
        """``{"name", "source", "num_files", "format", "label_rule", "fingerprint"}``: ``format`` is ``"folder"``
        (searched recursively) or ``"paths"`` (a list, a list file, one image); the fingerprint is
        :func:`vitscope.data.fingerprint.data_fingerprint`'s digest: it changes when files are added, removed
        or modified, and file contents are never read."""
        return {"name": self.name, "source": self.source, "num_files": len(self.paths), "format": self.format,
                "label_rule": NO_LABELS if self._labels is None else GIVEN_LABELS,
                "fingerprint": self.fingerprint()["digest"]}
