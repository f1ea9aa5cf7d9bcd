"""``vitscope.data.load_dataset``: one entry point over every supported on-disk format."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vitscope.data.formats.errors import DatasetFormatError


def _readers() -> dict[str, Callable[..., Any]]:
    from vitscope.data.formats.coco import CocoDataset
    from vitscope.data.formats.davis import DavisDataset
    from vitscope.data.formats.imagefolder import ImageFolderDataset
    from vitscope.data.formats.imagenet_boxes import ImageNetBoxesDataset
    from vitscope.data.formats.partimagenet import PartImageNetDataset
    from vitscope.data.formats.path_list import PathListDataset
    from vitscope.data.formats.revisitop import RevisitOPDataset
    from vitscope.data.formats.sop import SOPDataset
    from vitscope.data.formats.spair import SPairDataset

    return {
        "imagefolder": ImageFolderDataset,
        "imagenet-boxes": ImageNetBoxesDataset,
        "coco": CocoDataset,
        "partimagenet": PartImageNetDataset,
        "davis": DavisDataset,
        "spair": SPairDataset,
        "revisitop": RevisitOPDataset,
        "sop": SOPDataset,
        "list": PathListDataset,
    }


FORMATS: tuple[str, ...] = ("imagefolder", "imagenet-boxes", "coco", "partimagenet", "davis", "spair", "revisitop",
                            "sop", "list")


def format_of(reader: Any) -> str | None:
    """The format name (``"imagefolder"``, ``"coco"``...) whose reader ``reader`` is, or None for any other object."""
    return next((name for name, cls in _readers().items() if type(reader) is cls), None)


def _missing(root: str | Path) -> DatasetFormatError:
    return DatasetFormatError(f"dataset root '{root}' does not exist")


def detect_format(root: str | Path) -> str:
    """Guess the format from the layout (the files each official release has at its root; a list file, or a folder
    holding one ``*.txt`` list of ``path label`` lines of its files, is ``list``)."""
    from vitscope.data.formats.path_list import list_file_in

    r = Path(root)
    if not r.exists():  # nothing to tell a format from: say so, not that the layout is unknown
        raise _missing(root)
    if r.is_file():
        return "list"
    checks = [
        ("davis", lambda: (r / "ImageSets" / "2017").is_dir() and (r / "JPEGImages").is_dir()),
        ("spair", lambda: (r / "PairAnnotation").is_dir()),
        ("revisitop", lambda: any(r.glob("gnd_*.pkl"))),
        ("sop", lambda: (r / "Ebay_test.txt").is_file() or (r / "Ebay_train.txt").is_file()),
        ("imagenet-boxes", lambda: (r / "LOC_synset_mapping.txt").is_file()),
        ("partimagenet", lambda: (r / "annotations").is_dir() and (r / "images").is_dir()),
        ("coco", lambda: any((r / "annotations").glob("instances_*.json"))),
        ("list", lambda: list_file_in(r) is not None),  # before imagefolder: the list's images/ is no class
        ("imagefolder", lambda: r.is_dir() and any(p.is_dir() for p in r.iterdir())),
    ]
    for name, check in checks:
        if check():
            return name
    raise DatasetFormatError(f"cannot tell the format of '{root}'; name it: --data {root}::FORMAT (library: "
                             f"format=), FORMAT one of {', '.join(FORMATS)}")


#: formats whose releases ship several splits: the reader argument that names one
SPLIT_ARGUMENT = {"coco": "split", "partimagenet": "split", "davis": "split", "spair": "split", "sop": "split",
                  "imagenet-boxes": "split", "revisitop": "name", "hf": "split"}

#: the splits a root holds, for formats whose default split a download may lack (DAVIS test-dev comes alone,
#: COCO may be 2014 or train only)
_SPLITS_PRESENT: dict[str, Callable[[Path], list[str]]] = {
    "davis": lambda r: [p.stem for p in (r / "ImageSets" / "2017").glob("*.txt")],
    "coco": lambda r: [p.stem[len("instances_"):] for p in (r / "annotations").glob("instances_*.json")],
    "partimagenet": lambda r: [p.stem for p in (r / "annotations").glob("*.json")],
}


def parse_data(spec: str) -> tuple[str, str | None, dict[str, Any]]:
    """``ROOT::FORMAT:SPLIT`` (``:SPLIT`` and ``FORMAT`` optional) -> ``(root, format or None, reader options)``.

    Raises:
        DatasetFormatError: a split for a format that has none.
    """
    root, _, rest = spec.rpartition("::")
    fmt, _, split = rest.partition(":")
    if not split:
        return root, fmt or None, {}
    if fmt not in SPLIT_ARGUMENT:
        raise DatasetFormatError(f"--data {spec}: the {fmt or 'detected'} format takes no split; splits are for "
                                 f"{', '.join(SPLIT_ARGUMENT)}")
    return root, fmt, {SPLIT_ARGUMENT[fmt]: split}


def _default_split(fmt: str, root: Path, reader: Callable[..., Any]) -> dict[str, Any]:
    """The split to read when none was asked for: the reader's default where the root has it, else the one
    split there is, else a ``val`` split; several others are an error naming them."""
    import inspect

    present = sorted(_SPLITS_PRESENT[fmt](root))
    default = inspect.signature(reader).parameters["split"].default
    if not present or default in present:
        return {}
    if len(present) == 1:
        return {"split": present[0]}
    validation = [s for s in present if s.startswith("val")]
    if validation:
        return {"split": validation[-1]}
    raise DatasetFormatError(f"{root} holds the {fmt} splits {', '.join(present)} and not {default}; choose one "
                             f"with --data {root}::{fmt}:SPLIT")


def load_dataset(root: str | Path, format: str | None = None, **kwargs: Any) -> Any:
    """Open a dataset lazily (no image is decoded here).

    Args:
        root: dataset root (for ``format="list"`` a list file, or a folder holding one list of its files).
        format: one of :data:`FORMATS`; None detects it from the layout.
        **kwargs: reader options (``split``, ``category``, ``name``...). Without a ``split``, a DAVIS, COCO or
            PartImageNet root that lacks the reader's default split is read at the one split it holds (DAVIS
            test-dev, COCO 2014), or at its validation split.

    Returns:
        A lazy indexable dataset (``len``, ``ds[i]``) of AnnotatedImage / ImagePair / VideoSequence items.

    Raises:
        DatasetFormatError: unknown format, undetectable layout, or invalid content (one line).
    """
    if not Path(root).exists():
        raise _missing(root)
    fmt = format or detect_format(root)
    readers = _readers()
    if fmt not in readers:
        close = difflib.get_close_matches(fmt, FORMATS, n=1)
        hint = f" Did you mean {close[0]}?" if close else ""
        raise DatasetFormatError(f"unknown dataset format '{fmt}'.{hint} Known: {', '.join(FORMATS)}")
    if fmt in _SPLITS_PRESENT and "split" not in kwargs:
        kwargs = {**kwargs, **_default_split(fmt, Path(root), readers[fmt])}
    return readers[fmt](root, **kwargs)
