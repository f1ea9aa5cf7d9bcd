"""Generic ``path label`` list files (Hotels-50k, Google Landmarks v2 style): writer and lazy reader.

One ``relative/path.jpg <label>`` per line; the label is the last whitespace-separated field (so
paths may contain spaces). Blank lines and lines starting with ``#`` are ignored. Labels: if every
label is an integer they are used as they are (``class_names = None``); otherwise every label is a
name, the names numbered 0, 1, ... in sorted order as ImageFolder numbers its folders (``class_names[k]`` is the name
of label k), so a train and a test list of the same classes number them alike.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vitscope.atomic import write_text_atomic
from vitscope.data.formats.common import DatasetFileNotFoundError, LazyDataset, save_jpeg
from vitscope.data.formats.errors import DatasetFormatError, safe_join
from vitscope.data.items import AnnotatedImage
from vitscope.data.synthetic.scene import Scene

__all__ = ["PathListDataset", "list_file_in", "write_path_list"]


def write_path_list(
    scenes: Sequence[Scene],
    root: str | os.PathLike,
    list_name: str = "list.txt",
    label: str = "instance",
    label_names: Sequence[str] | None = None,
    image_dir: str = "images",
) -> Path:
    """Write scenes as ``root/<image_dir>/<k>.jpg`` and a ``path label`` list ``root/<list_name>``.

    Args:
        scenes: the images; each is labelled by its main (largest visible) object.
        root: dataset root (created if needed).
        list_name: name of the list file.
        label: ``"instance"`` (the object's ``instance_id``, as hotel / landmark ids) or ``"class"``.
        label_names: optional names indexed by that id; written instead of the integer (no whitespace).
        image_dir: folder of the images, relative to ``root``.

    Returns:
        The path of the list file.
    """
    if label not in ("instance", "class"):
        raise DatasetFormatError(f"label must be 'instance' or 'class', got {label!r}")
    root = Path(root)
    folder = safe_join(root, image_dir, "image_dir")
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["# path label"]
    for k, scene in enumerate(scenes):
        areas = [int(np.count_nonzero(o.mask)) for o in scene.objects]
        if not areas:
            raise DatasetFormatError(f"scene {k} has no object to label it by")
        obj = scene.objects[int(np.argmax(areas))]
        value: int | str = obj.instance_id if label == "instance" else obj.class_id
        if label_names is not None:
            value = str(label_names[value])
            if not value or len(value.split()) != 1:
                raise DatasetFormatError(f"label name {value!r} of scene {k} must be one word")
        save_jpeg(np.asarray(scene.image, dtype=np.uint8), folder / f"{k:06d}.jpg")
        lines.append(f"{image_dir}/{k:06d}.jpg {value}")
    list_file = safe_join(root, list_name, "list_name")
    write_text_atomic(list_file, "\n".join(lines) + "\n")
    return list_file


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def _first_entry(list_file: Path) -> str | None:
    """The path of the first ``path label`` line of ``list_file``, or None (no such line, not UTF-8 text)."""
    try:
        with open(list_file, encoding="utf-8-sig") as f:
            for line in f:
                text = line.strip()
                if text and not text.startswith("#"):
                    parts = text.rsplit(None, 1)
                    return parts[0] if len(parts) == 2 else None
    except (OSError, UnicodeDecodeError):
        return None
    return None


def list_file_in(folder: str | os.PathLike) -> Path | None:
    """The one ``*.txt`` directly in ``folder`` whose first ``path label`` line names a file under ``folder`` (the
    layout ``vitscope synth --format list`` writes: ``list.txt`` beside ``images/``), or None (no such file, or
    several ``*.txt``)."""
    texts = sorted(Path(folder).glob("*.txt"))
    if len(texts) != 1:
        return None
    first = _first_entry(texts[0])
    if first is None:
        return None
    try:
        return texts[0] if safe_join(Path(folder), first, texts[0].name).is_file() else None
    except DatasetFormatError:  # a path that leaves the folder: not a list of this folder
        return None


def is_labelled_list(list_file: str | os.PathLike) -> bool:
    """Whether ``list_file``'s first entry is a ``path label`` line (its path part names a file, the whole line
    does not), as ``vitscope synth --format list`` writes: such a ``.txt`` is read as ``::list``, not as a plain
    list of paths."""
    list_file = Path(list_file)
    first = _first_line(list_file)
    if first is None or (list_file.parent / first).expanduser().is_file():
        return False
    path = _first_entry(list_file)
    return path is not None and (list_file.parent / path).expanduser().is_file()


def _first_line(list_file: Path) -> str | None:
    try:
        with open(list_file, encoding="utf-8-sig") as f:
            return next((t for t in (line.strip() for line in f) if t and not t.startswith("#")), None)
    except (OSError, UnicodeDecodeError):
        return None


class PathListDataset(LazyDataset):
    """Lazy reader of a ``path label`` list: a sequence of ``AnnotatedImage`` (``label`` set).

    Construction parses the list only; an item's file is checked for existence on access (images
    are never decoded here). ``meta`` holds ``line`` and, for named labels, ``label_name``.

    Args:
        list_file: the list, or a folder holding one ``*.txt`` list whose paths are relative to it
            (:func:`list_file_in`).
        root: folder the paths are relative to; default the list file's folder.

    Raises:
        DatasetFormatError: missing list file, a line without a label, or an unsafe path (names the line).
    """

    def __init__(self, list_file: str | os.PathLike, root: str | os.PathLike | None = None) -> None:
        self.list_file = Path(list_file)
        if self.list_file.is_dir():
            found = list_file_in(self.list_file)
            if found is None:
                raise DatasetFormatError(f"{self.list_file} is a folder without one 'path label' list (*.txt) of "
                                         f"its files; name the list: --data {self.list_file}/LIST.txt::list")
            self.list_file = found
        self.root = Path(root) if root is not None else self.list_file.parent
        self.name = self.list_file.stem
        if not self.list_file.is_file():
            raise DatasetFormatError(f"list file {self.list_file} not found")
        fname = self.list_file.name
        paths: list[str] = []
        raw: list[str] = []
        lineno: list[int] = []
        try:
            with open(self.list_file, encoding="utf-8-sig") as f:
                for n, line in enumerate(f, start=1):
                    text = line.strip()
                    if not text or text.startswith("#"):
                        continue
                    parts = text.rsplit(None, 1)
                    if len(parts) != 2:
                        raise DatasetFormatError(f"line {n} of {fname}: expected 'path label', got {text!r}")
                    safe_join(self.root, parts[0], f"line {n} of {fname}")
                    paths.append(parts[0])
                    raw.append(parts[1])
                    lineno.append(n)
        except UnicodeDecodeError as err:
            raise DatasetFormatError(f"{fname} is not UTF-8 text: {err}") from err
        self._paths = paths
        self._lineno = np.asarray(lineno, dtype=np.int64)
        if all(_is_int(r) for r in raw):
            self.class_names: list[str] | None = None
            self._labels = np.asarray([int(r) for r in raw], dtype=np.int64)
        else:
            self.class_names = sorted(set(raw))
            index = {name: k for k, name in enumerate(self.class_names)}
            self._labels = np.asarray([index[r] for r in raw], dtype=np.int64)

    @property
    def image_paths(self) -> list[str]:
        """Every row's image path, resolved from :attr:`root` (the files need not exist)."""
        return [str(self.root / p) for p in self._paths]

    @property
    def labels(self) -> np.ndarray:
        """``[N]`` int64 labels of every row."""
        return self._labels.copy()

    def __len__(self) -> int:
        return len(self._paths)

    def _get(self, i: int) -> AnnotatedImage:
        path = self.root / self._paths[i]
        if not path.is_file():
            where = f"line {self._lineno[i]} of {self.list_file.name}"
            raise DatasetFileNotFoundError(f"image file {path} ({where}) not found")
        label = int(self._labels[i])
        meta: dict = {"line": int(self._lineno[i])}
        if self.class_names is not None:
            meta["label_name"] = self.class_names[label]
        return AnnotatedImage(image_path=str(path), label=label, meta=meta)

    def __repr__(self) -> str:
        return f"PathListDataset(list_file={str(self.list_file)!r}, images={len(self)})"
