"""The settings and the HSIC state of the CKA analyses (:class:`~vitscope.analyses.representation.cka.BlockCKA`,
:class:`~vitscope.analyses.representation.residual.ResidualCKA`): the options they accept, the state each
estimator keeps, what results.json records of the minibatches, and the warning for minibatches cut from data sorted
by class."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from vitscope.analyses.data_checks import DataFacts, sorted_by_class
from vitscope.analyses.representation.hsic import FullHSIC, MinibatchHSIC
from vitscope.analyses.representation.shuffled_hsic import ShuffledHSIC
from vitscope.errors import VitscopeValueError

__all__ = ["ESTIMATORS", "ORDERS", "TOKENS", "HSICState", "SortedMinibatchWarning", "check_cka_options",
           "hsic_state_cka", "merge_hsic", "minibatch_meta", "new_hsic_state", "prepared", "warn_if_sorted_by_class"]

ESTIMATORS = ("minibatch", "full", "full_unbiased")
TOKENS = ("all", "cls", "spatial", "spatial_mean")
#: how the minibatch estimator cuts the images into minibatches: ``dataset`` (consecutive dataset indices, the 002
#: code's loader over the data in order) or ``shuffled`` (a seeded shuffle of the images: :class:`ShuffledHSIC`)
ORDERS = ("dataset", "shuffled")
#: the state of one estimator (:func:`new_hsic_state`)
HSICState = MinibatchHSIC | ShuffledHSIC | FullHSIC


def prepared(state: HSICState, indices: Sequence[int], rep: torch.Tensor) -> Any:
    """What ``state.add`` needs of one representation (:meth:`MinibatchHSIC.prepare`; the rows for the full
    estimator)."""
    return state.prepare(indices, rep) if isinstance(state, MinibatchHSIC) else rep


class SortedMinibatchWarning(UserWarning):
    """Minibatch CKA in dataset order on data sorted by class: each minibatch holds few classes."""


def warn_if_sorted_by_class(name: str, data: DataFacts, estimator: str, order: str, batch: int) -> bool:
    """Warn (:class:`SortedMinibatchWarning`) before the pass when minibatch CKA in dataset order would average
    within-class CKAs (:func:`~vitscope.analyses.data_checks.sorted_by_class`), and say whether it did; other
    choices read no labels."""
    if not (estimator == "minibatch" and order == "dataset" and sorted_by_class(data, batch)):
        return False
    warnings.warn(f"{name}: the data is sorted by class, so each minibatch of {batch} images in dataset order "
                  "holds few classes and minibatch CKA measures mostly similarity within a class; set "
                  f"{name}.order=shuffled for the CKA over the data (with {name}.tokens=cls or spatial_mean: it "
                  "keeps every image's features until the end)", SortedMinibatchWarning, stacklevel=2)
    return True


def check_cka_options(tokens: str, estimator: str, batch: int, order: str = "dataset") -> None:
    """Raise ValueError on an unknown token selection, estimator or minibatch order, a minibatch size below 4, or a
    shuffled order for a full estimator (which has no minibatches)."""
    if tokens not in TOKENS:
        raise VitscopeValueError(f"tokens must be one of {TOKENS}, got {tokens!r}")
    if estimator not in ESTIMATORS:
        raise VitscopeValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
    if int(batch) != batch or batch < 4:
        raise VitscopeValueError(f"batch must be an integer >= 4, got {batch!r}")
    if order not in ORDERS:
        raise VitscopeValueError(f"order must be one of {ORDERS}, got {order!r}")
    if order != "dataset" and estimator != "minibatch":
        raise VitscopeValueError(f"order={order!r} chooses the minibatches of the minibatch estimator; the "
                                 f"{estimator} estimator uses every image at once (leave order at 'dataset')")


def new_hsic_state(estimator: str, batch: int, gram_minmax: bool, symmetric: bool, workdir: str | Path | None,
                   order: str = "dataset", seed: int = 0) -> HSICState:
    """The HSIC state of an estimator: streaming minibatch sums (minibatches of consecutive dataset indices), or
    every image's features on disk (shuffled minibatches, the full estimators)."""
    if estimator == "minibatch" and order == "shuffled":
        return ShuffledHSIC(batch, gram_minmax, symmetric, seed, workdir)
    if estimator == "minibatch":
        return MinibatchHSIC(batch, gram_minmax, symmetric)
    return FullHSIC(symmetric, workdir)


def merge_hsic(mine: HSICState, theirs: HSICState) -> HSICState:
    """Declared-state reduce of the HSIC states (``theirs`` is left unchanged)."""
    return mine.merge(theirs)  # type: ignore[arg-type]  # one kind per configuration; raises on other settings


def hsic_state_cka(state: HSICState, estimator: str) -> torch.Tensor | None:
    """``[A, B]`` CKA of an HSIC state (None when too few images)."""
    return state.cka(unbiased=estimator == "full_unbiased") if isinstance(state, FullHSIC) else state.cka()


def minibatch_meta(estimator: str, order: str, seed: int, sorted_data: bool = False) -> dict[str, Any]:
    """What results.json records of the minibatches: their ``order`` (and the shuffle's ``seed``, or
    ``sorted_by_class`` where dataset-order minibatches were warned of: :func:`warn_if_sorted_by_class`); nothing
    for the full estimators."""
    if estimator != "minibatch":
        return {}
    if order == "shuffled":
        return {"order": order, "seed": seed}
    return {"order": order, "sorted_by_class": True} if sorted_data else {"order": order}
