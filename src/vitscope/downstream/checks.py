"""Checks shared by the whole-benchmark probes (retrieval, DAVIS, SPair, ``probe_sweep``)."""

from __future__ import annotations

from typing import Any

from vitscope.errors import VitscopeValueError
from vitscope.models.backbone import Backbone

__all__ = ["layout_hint", "require_blocks", "require_classes", "require_regions", "tiling_scale"]


def require_blocks(backbone: Backbone, task: str) -> None:
    """Raise a one-line ValueError when ``backbone`` has no transformer blocks to probe.

    The probes cache ``blocks.{i}.<site>`` token sequences; a CNN's ``stages.{i}`` maps differ in grid and
    width from stage to stage, which the per-block feature cache (one grid per entry) does not hold.
    """
    spec = backbone.spec
    if not spec.is_transformer:
        raise VitscopeValueError(f"{task} probes read transformer blocks; {spec.name} is a CNN (stages.{{i}} maps), "
                                 "which the per-block probes do not support: use vitscope analyze (cka, "
                                 "mean_activation) instead")


def tiling_scale(tiling: bool | float | None) -> float | None:
    """``tiling`` option -> frame scale: False / None / 0 = no tiling, True = the paper's 2, a number >= 1 = it.

    Raises:
        ValueError: a number below 1 (other than 0).
    """
    if tiling is None or tiling is False or tiling == 0:
        return None
    if tiling is True:
        return 2.0
    if not float(tiling) >= 1:
        raise VitscopeValueError("tiling must be a scale >= 1 (frame side / model input side; the paper: 2), got "
                                 f"{tiling!r}")
    return float(tiling)


def layout_hint(dataset: Any, fmt: str) -> str:
    """`` (the folder looks like FORMAT: pass --data ROOT::FORMAT)`` when the layout says another format."""
    from vitscope.data.load import detect_format

    root = getattr(dataset, "root", None)
    if root is None:
        return ""
    try:
        found = detect_format(root)
    except ValueError:
        return ""
    return f"; the folder looks like {found} data: pass --data {root}::{found}" if found != fmt else ""


def require_classes(labels: Any, dataset: Any, fmt: str) -> None:
    """k-NN, linear probes and clustering score classes: at least two, with more than one image in some.

    Args:
        labels: ``[N]`` integer labels (-1: unlabelled).
        dataset: the reader (its ``classes`` name the labels, its ``root`` is checked for another layout).
        fmt: the format the data was read as.

    Raises:
        VitscopeValueError: one line naming the classes found and, where the folder looks like another format,
            the ``--data ROOT::FORMAT`` to use.
    """
    import numpy as np

    kept = labels[labels >= 0]
    classes, counts = np.unique(kept, return_counts=True)
    names = list(getattr(dataset, "classes", []) or [])
    shown = ", ".join(repr(names[c]) if c < len(names) else str(c) for c in classes[:3])
    if classes.size < 2:
        raise VitscopeValueError(f"{fmt} data with {classes.size} "
                                 f"class{'' if classes.size == 1 else 'es'}{f' ({shown})' if shown else ''}: k-NN, "
                                 f"linear probes and clustering need at least two classes{layout_hint(dataset, fmt)}")
    if counts.max() < 2:
        raise VitscopeValueError(f"{fmt} data with {classes.size} classes of one image each: k-NN and linear probes "
                                 f"need several images per class{layout_hint(dataset, fmt)}")


def require_regions(dataset: Any, fmt: str) -> None:
    """Region clustering groups object (or part) masks by class: it needs non-crowd masks of two classes.

    Raises:
        VitscopeValueError: one line saying how many annotated regions and classes the file holds.
    """
    coco = getattr(dataset, "coco", None)
    if coco is None:
        return
    classes = {a["category_id"] for a in coco.anns.values() if not a.get("iscrowd", 0)}
    if len(classes) < 2:
        regions = sum(1 for a in coco.anns.values() if not a.get("iscrowd", 0))
        raise VitscopeValueError(f"{fmt} data with {regions} annotated region(s) of {len(classes)} class(es) in "
                                 f"{getattr(dataset, 'ann_file', 'its annotation file')}: region clustering needs "
                                 "object masks of at least two classes")
