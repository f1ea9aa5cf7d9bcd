"""``FirstItems``: the first ``n`` items of a format reader (``vitscope probe --limit``).

Items are what the reader counts: images, DAVIS sequences, SPair pairs. The files it lists are only those of
the kept items plus the annotation files, so the data fingerprint (resume, the feature cache) tells a limited
set from the whole one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vitscope.errors import VitscopeValueError

__all__ = ["FirstItems"]

#: attributes a reader lists per item, sliced with the items (the ImageFolder, path-list and COCO readers; their
#: labels); a path list's ``image_paths`` comes before its ``_paths``, which are relative to the list's folder
_PER_ITEM = ("samples", "image_paths", "_paths", "labels")


class FirstItems:
    """A reader's first ``n`` items; every other attribute is the reader's own.

    Args:
        dataset: a format reader (``len``, ``dataset[i]``; :func:`vitscope.data.load_dataset`).
        n: how many items to keep (all of them when the reader has fewer).
    """

    def __init__(self, dataset: Any, n: int) -> None:
        if n < 1:
            raise VitscopeValueError(f"the limit must be at least 1, got {n}")
        self.dataset = dataset
        self.n = min(int(n), len(dataset))
        for attr in _PER_ITEM:
            listed = getattr(dataset, attr, None)
            if isinstance(listed, (list, tuple, np.ndarray)) and len(listed) == len(dataset):
                setattr(self, attr, listed[: self.n])

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if not -self.n <= i < self.n:
            raise IndexError(f"item {i} is beyond the first {self.n}")
        return self.dataset[i % self.n]

    def __getattr__(self, name: str) -> Any:  # name, root, first_frame_only... of the reader
        if name == "dataset":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def fingerprint_files(self) -> tuple[Sequence[str], Path]:
        """The files of the kept items (images, frames and their masks, pair images) and the reader's annotation
        files, relative to its root (:func:`~vitscope.data.annotated_source.reader_files`)."""
        from vitscope.data.annotated_source import reader_files

        return reader_files(self)
