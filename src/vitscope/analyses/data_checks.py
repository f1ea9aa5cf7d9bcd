"""Data an analysis cannot score, and the one message for each case (no labels, one class, one image per class,
no train/test split, one region class, missing ground truth).

Every path that feeds data to an analysis asks the same questions and gets the same words: ``vitscope analyze``
(an analysis named in ``--analyses`` is refused, a default one left out with the reason), ``vitscope.run`` (it
refuses before the pass), ``vitscope compare`` (its k-NN and clustering curves are left out with the reason as a
note) and ``vitscope probe`` (its workflow calls :func:`class_problem` and :func:`region_problem` too).

Before a pass an analysis sees the data as :class:`DataFacts`: the ground-truth keys, and on first use the
image labels and region classes read from the source (readers that list them open no image). After the pass,
its rows are checked again with the same functions (images skipped as unreadable can leave one class).
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

__all__ = ["LABELLED_PROBES", "DataFacts", "annotated_regions", "class_names", "class_problem", "data_name",
           "layout_hint", "missing_targets", "no_labels", "no_regions", "region_problem", "same_class_pairs",
           "sorted_by_class", "split_problem"]

#: the analyses that score image features against class labels
LABELLED_PROBES = "k-NN, linear probes and clustering"


def same_class_pairs(labels: np.ndarray) -> float | None:
    """The share of pairs of labelled images (``labels`` ``[m]``, -1 unknown) that share a class; None under two."""
    known = labels[labels >= 0]
    if len(known) < 2:
        return None
    counts = np.bincount(known)
    return float((counts * (counts - 1)).sum() / (len(known) * (len(known) - 1)))


def sorted_by_class(data: DataFacts, batch: int, minibatches: int = 4, spread: int = 64) -> bool:
    """Whether minibatches of ``batch`` images in dataset order hold far fewer classes than the data, as when the
    data is sorted by class (every ``imagefolder``: ImageNet's validation set gives each minibatch of 64 one or two
    classes). Pairs of images within the first ``minibatches`` minibatches share a class at least a quarter of
    the way from the share of pairs among ``spread`` images evenly spaced over the data (:func:`same_class_pairs`)
    to 1, and those images hold more than one class. Reads at most ``minibatches * batch + spread`` labels; False
    without labels or a source."""
    if data.source is None or "label" not in data.targets:
        return False
    n = len(data.source) if data.limit is None else min(data.limit, len(data.source))
    if n < 2 * batch:
        return False
    spaced = data.labels_at(np.linspace(0, n - 1, min(spread, n)).astype(np.int64))
    overall = same_class_pairs(spaced)
    if overall is None or overall >= 1.0:
        return False
    first = data.labels_at(range(min(n // batch, minibatches) * batch)).reshape(-1, batch)
    within = [share for share in map(same_class_pairs, first) if share is not None]
    return bool(within) and float(np.mean(within)) >= overall + 0.25 * (1.0 - overall)


def missing_targets(analysis: str, missing: Collection[str]) -> str:
    """An analysis needs ground truth (``batch.targets`` keys, e.g. ``masks``) that the data does not give."""
    return (f"analysis '{analysis}' needs ground truth {', '.join(sorted(missing))}, which this data does not "
            "provide; use an annotated dataset (e.g. --data ROOT::coco) or leave it out")


def no_labels(data: str, hint: str = "") -> str:
    """The data has no image labels (``data``: what to call it, e.g. ``"imagefolder data"``; ``hint``: appended,
    e.g. why the reader found none, :func:`layout_hint`)."""
    return (f"{data} has no image labels: {LABELLED_PROBES} need a class label per image; use a labelled dataset "
            f"(--data ROOT::imagefolder, ::coco, ::partimagenet...){hint}")


def no_regions(analysis: str, level: str) -> str:
    """Object- or part-level rows need region masks with their labels (the source's ``regions``)."""
    return (f"{analysis}: {level}-level rows need region masks and their labels, which this data does not give; use "
            "a dataset with instance or part masks (--data ROOT::coco or ROOT::partimagenet)")


def class_problem(labels: np.ndarray, data: str = "the data", names: Sequence[str] = (), hint: str = ""
                  ) -> str | None:
    """Why k-NN, linear probes and clustering cannot score ``labels`` (None when they can).

    They need labels, at least two classes, and more than one image in some class (with one image per class
    a k-NN vote has no neighbour of the same class and k-means gives every image a cluster of its own).

    Args:
        labels: ``[N]`` integer labels (-1: unlabelled, not a class).
        data: what to call the data (``"imagefolder data"``).
        names: class names, indexed by label.
        hint: appended to the message (:func:`layout_hint`).
    """
    labels = np.asarray(labels)
    kept = labels[labels >= 0]
    if kept.size == 0:
        return no_labels(data, hint)
    classes, counts = np.unique(kept, return_counts=True)
    shown = ", ".join(repr(names[c]) if c < len(names) else str(c) for c in classes[:3])
    if classes.size < 2:
        return f"{data} with 1 class ({shown}): {LABELLED_PROBES} need at least two classes{hint}"
    if counts.max() < 2:
        return (f"{data} with {classes.size} classes of one image each: {LABELLED_PROBES} need several images per "
                f"class{hint}")
    return None


def split_problem(test: np.ndarray, test_fraction: float) -> str | None:
    """Why the held-out split ``test`` (``[N]`` bool, True = test image) cannot score k-NN or a linear probe."""
    test = np.asarray(test, dtype=bool)
    if test.any() and not test.all():
        return None
    return (f"{test.size} labelled images cannot be split into train and test at a test fraction of {test_fraction}: "
            "k-NN and linear probes need images on both sides; add images or change the test fraction")


def region_problem(regions: int, classes: int, data: str = "the data", where: str = "") -> str | None:
    """Region clustering groups object (or part) masks by class: it needs non-crowd masks of two classes, and more
    masks than classes.

    Args:
        regions: annotated (non-crowd) regions; classes: their distinct classes.
        data: what to call the data; where: the annotation file, named in the message.
    """
    if classes >= 2 and regions > classes:
        return None
    found = f"{data} with {regions} annotated region(s) of {classes} class(es){f' in {where}' if where else ''}"
    if classes >= 2:  # one region per class: k-means gives each its own cluster, a perfect score that says nothing
        return f"{found}, one each: region clustering needs several regions of some class"
    return f"{found}: region clustering needs object masks of at least two classes"


def layout_hint(dataset: Any, fmt: str | None) -> str:
    """``; the folder looks like FORMAT data: pass --data ROOT::FORMAT`` when the layout says another format, or the
    reader's own ``label_advice`` (why it found no labels where some were meant, e.g. a label column of plain ints)."""
    from vitscope.data.load import detect_format

    seen, advice = dataset, None
    while seen is not None and advice is None:  # a source, or what it wraps (``probe --limit``)
        advice, seen = getattr(seen, "label_advice", None), getattr(seen, "dataset", None)
    if advice:
        return f"; {advice}"
    root = getattr(dataset, "root", None)
    if root is None or fmt is None:
        return ""
    try:
        found = detect_format(root)
    except ValueError:
        return ""
    return f"; the folder looks like {found} data: pass --data {root}::{found}" if found != fmt else ""


def class_names(reader: Any) -> list[str]:
    """Class names indexed by label, where a format reader names them (``classes``, or a list's ``class_names``)."""
    return list(getattr(reader, "classes", None) or getattr(reader, "class_names", None) or [])


def annotated_regions(reader: Any) -> tuple[int, int, str] | None:
    """``(non-crowd regions, their classes, annotation file)`` of a COCO-style reader, or None for other readers."""
    coco = getattr(reader, "coco", None)
    if coco is None:
        return None
    anns = [a for a in coco.anns.values() if not a.get("iscrowd", 0)]
    return len(anns), len({a["category_id"] for a in anns}), str(getattr(reader, "ann_file", "its annotation file"))


def _reader(source: Any) -> Any:
    """The format reader behind a source (``AnnotatedSource.dataset``; behind ``FirstItems`` too), or None."""
    from vitscope.data.first_items import FirstItems

    reader = getattr(source, "dataset", None)
    while isinstance(reader, FirstItems):  # ``probe --limit``: the same data, named as without it
        reader = reader.dataset
    return reader


def _format(source: Any) -> str | None:
    reader = _reader(source)
    if reader is None:
        return None
    from vitscope.data.load import format_of

    return format_of(reader)


def data_name(source: Any) -> str:
    """What the messages call a source: ``"<format> data"`` for a format reader, else ``"data '<name>'"``."""
    fmt = _format(source)
    return f"{fmt} data" if fmt else f"data {getattr(source, 'name', 'images')!r}"


class DataFacts:
    """What analyses may check about a dataset before a pass, read from its Source on first use.

    Args:
        source: the :class:`~vitscope.data.source.Source` (None: only ``targets`` are known).
        targets: ground-truth keys the batches will carry (default: the source's ``target_keys()``).
        limit: the pass reads only the first ``limit`` images.
    """

    def __init__(self, source: Any = None, targets: Collection[str] | None = None, limit: int | None = None) -> None:
        self.source = source
        self.limit = limit
        if targets is None:
            targets = source.target_keys() if source is not None else ()
        self.targets = frozenset(targets)

    @functools.cached_property
    def name(self) -> str:
        """What messages call the data (:func:`data_name`)."""
        return data_name(self.source) if self.source is not None else "the data"

    @functools.cached_property
    def labels(self) -> np.ndarray | None:
        """``[n]`` image labels of the images the pass reads (-1: none), or None when unknown (no source)."""
        if self.source is None:
            return None
        try:
            labels = np.asarray(self.source.labels(), dtype=np.int64)
        except ValueError:  # the source has no image labels
            labels = np.full(len(self.source), -1, dtype=np.int64)
        return labels if self.limit is None else labels[: self.limit]

    def labels_at(self, indices: Sequence[int]) -> np.ndarray:
        """``[len(indices)]`` labels of those dataset indices (-1 where unknown or unreadable), read one entry at a
        time unless :attr:`labels` was already read: a few images, never the whole of a streamed dataset."""
        if "labels" in self.__dict__ and self.labels is not None:
            return self.labels[np.asarray(indices, dtype=np.int64)]
        out = np.full(len(indices), -1, dtype=np.int64)
        for k, i in enumerate(indices):
            try:
                label = self.source.targets(int(i)).get("label")
            except Exception:  # an unreadable entry: unknown here; the pass reports it
                continue
            out[k] = -1 if label is None else int(label)
        return out

    @functools.cached_property
    def class_names(self) -> list[str]:
        """Class names indexed by label: the source's own ``class_names`` (a Hugging Face ClassLabel's), else its
        reader's (:func:`class_names`)."""
        own = getattr(self.source, "class_names", None)
        return list(own) if isinstance(own, (list, tuple)) and own else class_names(_reader(self.source))

    @functools.cached_property
    def hint(self) -> str:
        """:func:`layout_hint` of the source's folder."""
        reader = _reader(self.source)
        return layout_hint(self.source if reader is None else reader, _format(self.source))

    @functools.cached_property
    def has_regions(self) -> bool:
        """Whether the source gives region masks with their labels (``Source.regions``, which the engine loads for
        analyses that require ``regions``), asked of its first readable entries; False without a source."""
        if self.source is None:
            return False
        for i in range(min(len(self.source), 3)):
            try:
                self.source.regions(i)
                return True
            except Exception:  # none here (an unreadable entry, or a source without regions): try the next one
                continue
        return False

    @functools.cached_property
    def regions(self) -> tuple[int, int, str] | None:
        """:func:`annotated_regions` of the reader (None when unknown)."""
        return annotated_regions(_reader(self.source))

    def class_problem(self) -> str | None:
        """:func:`class_problem` of the labels (None when unknown or fine); without a ``label`` target the labels
        are not read (:func:`no_labels`)."""
        if "label" not in self.targets:
            return no_labels(self.name, self.hint)
        if self.labels is None:
            return None
        return class_problem(self.labels, self.name, self.class_names, self.hint)

    def region_problem(self) -> str | None:
        """:func:`region_problem` of the annotated regions (None when unknown or fine)."""
        return region_problem(*self.regions[:2], self.name, self.regions[2]) if self.regions else None
