"""Checks shared by the whole-benchmark probes (retrieval, DAVIS, SPair, ``probe_sweep``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from vitscope.analyses.data_checks import annotated_regions, class_names, class_problem, layout_hint, region_problem
from vitscope.errors import DegenerateDataError, VitscopeValueError
from vitscope.models.backbone import Backbone

__all__ = ["class_keys", "layout_hint", "require_blocks", "require_classes", "require_regions", "tiling_scale",
           "train_numbered_labels"]


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


def require_classes(labels: Any, dataset: Any, fmt: str) -> None:
    """k-NN, linear probes and clustering score classes: at least two, with more than one image in some.

    Args:
        labels: ``[N]`` integer labels (-1: unlabelled).
        dataset: the reader (its ``classes`` name the labels, its ``root`` is checked for another layout).
        fmt: the format the data was read as.

    Raises:
        DegenerateDataError: :func:`vitscope.analyses.data_checks.class_problem`'s line (the one the analyses give),
            naming the classes found and, where the folder looks like another format, the ``--data ROOT::FORMAT``
            to use.
    """
    problem = class_problem(labels, f"{fmt} data", class_names(dataset), layout_hint(dataset, fmt))
    if problem:
        raise DegenerateDataError(problem)


def require_regions(dataset: Any, fmt: str) -> None:
    """Region clustering groups object (or part) masks by class: it needs non-crowd masks of two classes.

    Raises:
        DegenerateDataError: :func:`vitscope.analyses.data_checks.region_problem`'s line: how many annotated
            regions and classes the file holds.
    """
    found = annotated_regions(dataset)
    problem = region_problem(found[0], found[1], f"{fmt} data", found[2]) if found else None
    if problem:
        raise DegenerateDataError(problem)


def class_keys(source: Any) -> list[str]:
    """What names each label of a source, where something does (``[]`` for bare integer labels): an ImageNet layout's
    wnids (its class names repeat), else the names :func:`class_names` finds on the source (a ``datasets`` column's)
    or its reader (class folders, a list's label names)."""
    holders = [h for h in (source, getattr(source, "dataset", None)) if h is not None]
    for holder in holders:
        wnids = getattr(holder, "wnids", None)
        if wnids is not None and len(wnids):
            return [str(n) for n in wnids]
    for holder in holders:
        names = class_names(holder)
        if len(names):
            return [str(n) for n in names]
    return []


def train_numbered_labels(test_labels: np.ndarray, train_names: list[str], test_names: list[str]) -> np.ndarray:
    """``[N]`` test labels renumbered as the train data numbers the same class names (two folders or lists of one
    task number their classes each by its own names); unchanged where either side has no names.

    Args:
        test_labels: ``[N]`` int64 labels of the test data (-1: unlabelled).
        train_names, test_names: :func:`class_keys` of each side (``names[k]`` names label ``k``).

    Raises:
        DegenerateDataError: a test image's class the train data does not have (no probe trained on it can
            predict it), naming them.
    """
    test_labels = np.asarray(test_labels, dtype=np.int64)
    labelled = test_labels >= 0
    if not train_names or not test_names or list(train_names) == list(test_names):
        return test_labels
    if labelled.any() and test_labels[labelled].max() >= len(test_names):  # names that do not cover the labels
        return test_labels
    index = {name: k for k, name in enumerate(train_names)}
    used = [test_names[k] for k in np.unique(test_labels[labelled])]
    missing = [name for name in used if name not in index]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise DegenerateDataError(f"the test data has {len(missing)} class(es) the train data lacks ({shown}): a probe "
                                  f"trained on the train data's {len(train_names)} classes cannot predict them; give "
                                  "test data of the train data's classes")
    to_train = np.asarray([index.get(name, -1) for name in test_names], dtype=np.int64)
    out = test_labels.copy()
    out[labelled] = to_train[test_labels[labelled]]
    return out
