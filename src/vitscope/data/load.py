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


def detect_format(root: str | Path) -> str:
    """Guess the format from the layout (the files each official release has at its root)."""
    r = Path(root)
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
        ("imagefolder", lambda: r.is_dir() and any(p.is_dir() for p in r.iterdir())),
    ]
    for name, check in checks:
        if check():
            return name
    raise DatasetFormatError(f"cannot tell the format of '{root}'; pass format= one of {', '.join(FORMATS)}")


def load_dataset(root: str | Path, format: str | None = None, **kwargs: Any) -> Any:
    """Open a dataset lazily (no image is decoded here).

    Args:
        root: dataset root (a list file for ``format="list"``).
        format: one of :data:`FORMATS`; None detects it from the layout.
        **kwargs: reader options (``split``, ``category``, ``name``...).

    Returns:
        A lazy indexable dataset (``len``, ``ds[i]``) of AnnotatedImage / ImagePair / VideoSequence items.

    Raises:
        DatasetFormatError: unknown format, undetectable layout, or invalid content (one line).
    """
    if not Path(root).exists():
        raise DatasetFormatError(f"dataset root '{root}' does not exist")
    fmt = format or detect_format(root)
    readers = _readers()
    if fmt not in readers:
        close = difflib.get_close_matches(fmt, FORMATS, n=1)
        hint = f" Did you mean {close[0]}?" if close else ""
        raise DatasetFormatError(f"unknown dataset format '{fmt}'.{hint} Known: {', '.join(FORMATS)}")
    return readers[fmt](root, **kwargs)
