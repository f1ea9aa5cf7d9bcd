"""Stanford Online Products (SOP) list files: writer and lazy, compact reader.

Layout (as the official release)::

    root/Ebay_train.txt, root/Ebay_test.txt   header "image_id class_id super_class_id path", then rows
                                              "1 1 1 bicycle_final/111085122871_0.JPG" (ids 1-based)
    root/<super_class>_final/<product>_<k>.JPG

SOP classes are products (instances); train and test hold disjoint classes. The reader returns
``label = class_id - 1`` (0-based) and ``meta = {"super_class": super_class_id - 1 (0-based),
"image_id": image_id (as written, 1-based), "line": line number}``. Columns are parsed once into
numpy arrays and one string blob, so a million-row list costs a few tens of MB, not a million objects.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vitscope.atomic import write_text_atomic
from vitscope.data.formats.common import DatasetFileNotFoundError, LazyDataset, save_jpeg
from vitscope.data.formats.errors import DatasetFormatError, safe_join
from vitscope.data.items import AnnotatedImage
from vitscope.data.synthetic.scene import ClassSpec, Scene, SceneObject

__all__ = ["SOPDataset", "SOP_HEADER", "write_sop"]

SOP_HEADER = ("image_id", "class_id", "super_class_id", "path")


def _main_object(scene: Scene, where: str) -> SceneObject:
    areas = [int(np.count_nonzero(o.mask)) for o in scene.objects]
    if not areas:
        raise DatasetFormatError(f"{where} has no object")
    return scene.objects[int(np.argmax(areas))]


def write_sop(
    scenes: Sequence[Scene],
    root: str | os.PathLike,
    split_fraction: float = 0.5,
    class_specs: Sequence[ClassSpec] | None = None,
) -> Path:
    """Write synthetic scenes as an SOP dataset (``Ebay_train.txt`` and ``Ebay_test.txt``).

    Each scene is labelled by its main (largest visible) object: ``class_id = instance_id + 1``,
    ``super_class_id = class_id_of_object + 1``. Classes are split as SOP does, by class: the
    ``round(split_fraction * n_classes)`` smallest instance ids go to train, the rest to test.
    Image ids restart at 1 in each file. Images go to ``<super_class_name>_final/<instance>_<k>.JPG``.

    Args:
        scenes: the images.
        root: dataset root (created if needed).
        split_fraction: fraction of classes (products) in the train list, in [0, 1].
        class_specs: names of the super classes (``ClassSpec.name``); default ``class<k>``.

    Returns:
        The root path.
    """
    if not 0.0 <= split_fraction <= 1.0:
        raise DatasetFormatError(f"split_fraction must be in [0, 1], got {split_fraction}")
    root = Path(root)
    mains = [_main_object(s, f"scene {i}") for i, s in enumerate(scenes)]
    classes = sorted({o.instance_id for o in mains})
    train_classes = set(classes[: round(split_fraction * len(classes))])
    rows: dict[str, list[str]] = {"train": [], "test": []}
    counts: dict[int, int] = {}
    for scene, obj in zip(scenes, mains):
        sup_name = class_specs[obj.class_id].name if class_specs is not None else f"class{obj.class_id}"
        k = counts.get(obj.instance_id, 0)
        counts[obj.instance_id] = k + 1
        rel = f"{sup_name}_final/{obj.instance_id}_{k}.JPG"
        path = safe_join(root, rel, f"scene {scene.index}")
        path.parent.mkdir(parents=True, exist_ok=True)
        save_jpeg(np.asarray(scene.image, dtype=np.uint8), path)
        split = "train" if obj.instance_id in train_classes else "test"
        rows[split].append(f"{obj.instance_id + 1} {obj.class_id + 1} {rel}")
    for split, lines in rows.items():
        body = "".join(f"{i} {line}\n" for i, line in enumerate(lines, start=1))
        write_text_atomic(root / f"Ebay_{split}.txt", " ".join(SOP_HEADER) + "\n" + body)
    return root


class SOPDataset(LazyDataset):
    """Lazy reader of ``Ebay_<split>.txt``: a sequence of ``AnnotatedImage`` (see module docstring).

    Construction parses and validates every row (no image is opened); an item's image file is
    checked for existence when the item is accessed.

    Args:
        root: dataset root holding ``Ebay_<split>.txt``.
        split: ``"train"`` or ``"test"`` (any ``Ebay_<split>.txt``, e.g. ``"info"``, works).

    Raises:
        DatasetFormatError: missing list file, bad header, or a malformed row (names the line).
    """

    def __init__(self, root: str | os.PathLike, split: str = "test") -> None:
        self.root = Path(root)
        self.split = split
        self.name = f"sop-{split}"
        self.list_file = safe_join(self.root, f"Ebay_{split}.txt", "split name")
        if not self.list_file.is_file():
            raise DatasetFormatError(f"SOP list file {self.list_file} not found")
        self._parse()

    def _parse(self) -> None:
        fname = self.list_file.name
        ids, cls, sup, lineno = array("q"), array("q"), array("q"), array("q")
        paths: list[str] = []
        header_seen = False
        with open(self.list_file, encoding="utf-8") as f:
            try:
                for n, line in enumerate(f, start=1):
                    fields = line.split()
                    if not fields:
                        continue
                    if not header_seen:
                        if tuple(fields) != SOP_HEADER:
                            raise DatasetFormatError(
                                f"line {n} of {fname}: expected header {' '.join(SOP_HEADER)!r}, got {line.strip()!r}"
                            )
                        header_seen = True
                        continue
                    if len(fields) != 4:
                        raise DatasetFormatError(
                            f"line {n} of {fname}: expected 'image_id class_id super_class_id path', "
                            f"got {line.strip()!r}"
                        )
                    try:
                        a, b, c = int(fields[0]), int(fields[1]), int(fields[2])
                    except ValueError:
                        raise DatasetFormatError(
                            f"line {n} of {fname}: ids must be integers, got {line.strip()!r}"
                        ) from None
                    if a < 1 or b < 1 or c < 1:
                        raise DatasetFormatError(f"line {n} of {fname}: ids are 1-based, got {line.strip()!r}")
                    ids.append(a)
                    cls.append(b)
                    sup.append(c)
                    lineno.append(n)
                    paths.append(fields[3])
            except UnicodeDecodeError as err:
                raise DatasetFormatError(f"{fname} is not UTF-8 text: {err}") from err
        if not header_seen:
            raise DatasetFormatError(f"{fname} is empty; expected header {' '.join(SOP_HEADER)!r}")
        self._image_id = np.frombuffer(ids, dtype=np.int64)
        self._class_id = np.frombuffer(cls, dtype=np.int64)
        self._super_id = np.frombuffer(sup, dtype=np.int64)
        self._lineno = np.frombuffer(lineno, dtype=np.int64)
        lengths = np.fromiter(map(len, paths), dtype=np.int64, count=len(paths))
        self._starts = np.concatenate([[0], np.cumsum(lengths + 1)]).astype(np.int64)
        self._blob = "\n".join(paths)
        del paths
        if self._blob.startswith("/") or any(s in self._blob for s in ("..", "\\", ":", "\n/", "\x00")):
            for i in range(len(self)):  # slow path only when something looks unsafe
                safe_join(self.root, self._path(i), f"line {self._lineno[i]} of {fname}")

    def _path(self, i: int) -> str:
        return self._blob[self._starts[i] : self._starts[i + 1] - 1]

    @property
    def labels(self) -> np.ndarray:
        """``[N]`` int64 0-based class (product) labels of every row."""
        return self._class_id - 1

    def __len__(self) -> int:
        return len(self._image_id)

    def _get(self, i: int) -> AnnotatedImage:
        path = self.root / self._path(i)
        if not path.is_file():
            where = f"line {self._lineno[i]} of {self.list_file.name}"
            raise DatasetFileNotFoundError(f"image file {path} ({where}) not found")
        return AnnotatedImage(
            image_path=str(path),
            label=int(self._class_id[i]) - 1,
            meta={
                "super_class": int(self._super_id[i]) - 1,
                "image_id": int(self._image_id[i]),
                "line": int(self._lineno[i]),
            },
        )

    def __repr__(self) -> str:
        return f"SOPDataset(root={str(self.root)!r}, split={self.split!r}, images={len(self)})"
