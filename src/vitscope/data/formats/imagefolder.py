"""Class-per-folder image datasets (the torchvision ``ImageFolder`` layout, without torchvision).

Layout::

    root/<class_name>/<file>.png|.jpg|...
    root/<class_name>/<any sub-folders>/<file>.png|...

Classes are the sorted sub-folder names; an image's label is the index of its folder. As torchvision's, a
class folder is read whole, its sub-folders (and links to folders) included. Files whose suffix is not an image
suffix (:data:`vitscope.data.images.IMAGE_EXTENSIONS`) and hidden files and folders are ignored. Construction
only lists folders; an item is checked for existence when accessed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from vitscope.atomic import OUTPUT_MANIFEST
from vitscope.data.formats.common import (
    DatasetFileNotFoundError,
    DatasetFormatError,
    LazyDataset,
    PathLike,
    image_suffix,
    require_file,
    save_image,
)
from vitscope.data.images import IMAGE_EXTENSIONS
from vitscope.data.items import AnnotatedImage
from vitscope.data.synthetic.scene import Scene
from vitscope.errors import VitscopeValueError


def write_imagefolder(
    scenes: Iterable[Scene], root: PathLike, class_names: Sequence[str], image_format: str = "png"
) -> list[Path]:
    """Write scenes as ``root/<class_names[scene.label]>/<scene.index:06d>.<image_format>``.

    Every class gets its folder even when no scene has that label, so the reader's class indices equal
    the positions in ``class_names`` whenever ``class_names`` is sorted (the reader sorts folder names).

    Args:
        scenes: scenes to write; ``scene.label`` indexes ``class_names``.
        root: output folder (created).
        class_names: folder name of each class; must be valid, distinct single path components.
        image_format: ``"png"`` (lossless, default) or ``"jpg"``.

    Returns:
        The written image paths, in the order of ``scenes``.
    """
    suffix = image_suffix(image_format)
    names = list(class_names)
    for name in names:
        if not name or name in (".", "..") or "/" in name or "\\" in name:
            raise VitscopeValueError(f"class name {name!r} cannot be a folder name")
    if len(set(names)) != len(names):
        raise VitscopeValueError("class names must be distinct")
    root = Path(root)
    for name in names:
        (root / name).mkdir(parents=True, exist_ok=True)
    paths = []
    for scene in scenes:
        if not 0 <= scene.label < len(names):
            raise VitscopeValueError(f"scene {scene.index} has label {scene.label}, outside the {len(names)} class "
                                     "names")
        path = root / names[scene.label] / f"{scene.index:06d}{suffix}"
        paths.append(save_image(scene.image, path))
    return paths


def _images_under(folder: Path, exts: tuple[str, ...]) -> list[Path]:
    """The image files in ``folder`` and its sub-folders (links followed, hidden names skipped) in torchvision's
    order: by folder path as a string, then by file name, so image ``i`` is torchvision's image ``i``."""
    walked, seen = [], set()
    for top, dirs, files in os.walk(folder, followlinks=True):
        info = os.stat(top)
        if (info.st_dev, info.st_ino) in seen:  # each real folder once, so a link loop ends
            dirs[:] = []
            continue
        seen.add((info.st_dev, info.st_ino))
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        walked.append((top, sorted(f for f in files if Path(f).suffix.lower() in exts and not f.startswith("."))))
    return [Path(top) / f for top, files in sorted(walked) for f in files]


class ImageFolderDataset(LazyDataset):
    """Reader of the class-per-folder layout.

    Items are :class:`AnnotatedImage` with ``image_path`` and ``label`` (index into :attr:`classes`), and
    ``meta["class_name"]``. Order: classes sorted, then torchvision's order within a class (folder, file).

    Attributes:
        classes: sorted sub-folder names.
        samples: ``(path, label)`` pairs.
    """

    def __init__(self, root: PathLike, extensions: Sequence[str] = IMAGE_EXTENSIONS) -> None:
        """List ``root``.

        Raises:
            DatasetFileNotFoundError: ``root`` is not a folder.
            DatasetFormatError: no class folder holds an image file.
        """
        super().__init__(root, name=f"imagefolder:{Path(root).name}")
        if not self.root.is_dir():
            raise DatasetFileNotFoundError(f"image folder dataset not found: {self.root} is not a folder")
        exts = tuple(e.lower() for e in extensions)
        outputs = _output_files(self.root)
        found = {}
        for name in sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if outputs and _only_outputs(self.root / name, outputs):  # an --out in the data, or its sub-folders
                continue
            found[name] = [p for p in _images_under(self.root / name, exts) if os.path.normpath(p) not in outputs]
        self.classes: list[str] = list(found)
        self.samples: list[tuple[Path, int]] = []
        for label, name in enumerate(self.classes):
            self.samples.extend((path, label) for path in found[name])
        if not self.samples:
            raise DatasetFormatError(
                f"no images found in {self.root}: expected root/<class>/<image> with suffixes {', '.join(exts)}"
            )

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def labels(self) -> np.ndarray:
        """``[N]`` int64 class index of every image (from the listing: no file is opened)."""
        return np.asarray([label for _, label in self.samples], dtype=np.int64)

    def _get(self, index: int) -> AnnotatedImage:
        path, label = self.samples[index]
        require_file(path, f"{self.name} item {index}")
        return AnnotatedImage(image_path=str(path), label=label, meta={"class_name": self.classes[label]})


def _output_files(root: Path) -> set[str]:
    """The files a vitscope run wrote into ``root`` or one of its sub-folders, as their manifests
    (:data:`~vitscope.atomic.OUTPUT_MANIFEST`) list them: normalised paths. A manifest that cannot be read lists
    nothing."""
    from vitscope.data.files import output_files

    found: set[str] = set()
    for folder in (root, *(p for p in root.iterdir() if p.is_dir())):
        if (folder / OUTPUT_MANIFEST).is_file():
            found |= {os.path.normpath(folder / rel) for rel in output_files(folder / OUTPUT_MANIFEST)}
    return found


def _only_outputs(folder: Path, outputs: set[str]) -> bool:
    """Whether every file under ``folder`` (hidden ones aside) is a run's output: a folder of outputs, no class."""
    files = []
    for top, dirs, names in os.walk(folder, followlinks=True):
        dirs[:] = [d for d in dirs if not d.startswith(".")]  # a killed run's state and staging folders
        files += [os.path.normpath(Path(top) / f) for f in names if not f.startswith(".")]
    return bool(files) and all(f in outputs for f in files)
