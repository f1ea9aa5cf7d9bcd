"""Units (SAE latents, neurons, components, centroids...) scored as detectors of concepts on tokens: the AUROC of
every unit for every concept, a unit's F1 at a threshold, and how many units a linear read-out needs.

Pure functions on arrays: no I/O, no plotting, no global state.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from vitscope.errors import VitscopeValueError

__all__ = ["auroc_table", "best_f1_threshold", "f1_at", "ranked_units", "units_needed"]


def _tensor(x: torch.Tensor | np.ndarray, name: str, dims: int) -> torch.Tensor:
    t = x.detach().cpu() if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    if t.dim() != dims:
        raise VitscopeValueError(f"{name} must have {dims} dimensions, got shape {tuple(t.shape)}")
    return t


def _mean_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks within every row of ``[k, n]`` values, tied values at their mean rank (float64)."""
    n = values.shape[1]
    order = np.argsort(values, axis=1)
    ordered = np.take_along_axis(values, order, axis=1)
    first = np.ones_like(ordered, dtype=bool)
    first[:, 1:] = ordered[:, 1:] != ordered[:, :-1]  # where a run of equal values starts
    last = np.ones_like(first)
    last[:, :-1] = first[:, 1:]
    position = np.arange(n)[None, :]
    start = np.maximum.accumulate(np.where(first, position, 0), axis=1)
    end = np.minimum.accumulate(np.where(last, position, n)[:, ::-1], axis=1)[:, ::-1]
    ranks = np.empty(values.shape, dtype=np.float64)
    np.put_along_axis(ranks, order, (start + end) / 2 + 1, axis=1)
    return ranks


def auroc_table(units: torch.Tensor | np.ndarray, labels: torch.Tensor | np.ndarray, chunk: int = 64
                ) -> torch.Tensor:
    """The area under the ROC curve of every unit as a score of every concept.

    The Mann-Whitney form: ``(sum of the positives' ranks - P (P + 1) / 2) / (P N)``, tied values sharing their mean
    rank, which is what ``sklearn.metrics.roc_auc_score`` gives, for all pairs at the cost of one sort per unit.

    Args:
        units: ``[n, m]`` the units' values on ``n`` tokens.
        labels: ``[n, C]`` bool: which tokens hold each concept.
        chunk: units ranked at once (memory: about ``4 n chunk`` numbers).

    Returns:
        ``[C, m]`` float64; NaN for a concept with no positive or no negative token, and for a unit holding NaN
        or infinity on some token (scikit-learn refuses such a column; it ranks last in :func:`ranked_units`).
    """
    u = _tensor(units, "units", 2).numpy()
    y = _tensor(labels, "labels", 2).numpy().astype(np.float64)
    if u.shape[0] != y.shape[0]:
        raise VitscopeValueError(f"units and labels must share their tokens, got {u.shape[0]} and {y.shape[0]}")
    positives = y.sum(axis=0)
    negatives = y.shape[0] - positives
    sums = np.empty((y.shape[1], u.shape[1]), dtype=np.float64)
    for start in range(0, u.shape[1], chunk):
        sums[:, start:start + chunk] = y.T @ _mean_ranks(np.ascontiguousarray(u[:, start:start + chunk].T)).T
    with np.errstate(divide="ignore", invalid="ignore"):
        auc = (sums - (positives * (positives + 1) / 2)[:, None]) / (positives * negatives)[:, None]
    auc[(positives == 0) | (negatives == 0)] = np.nan
    auc[:, ~np.isfinite(u).all(axis=0)] = np.nan  # a sort ranks NaN above every number: no score for such a unit
    return torch.from_numpy(auc)


def ranked_units(table: torch.Tensor, both_signs: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Units from the best detector of each concept to the worst, and the sign each one is read with.

    Args:
        table: ``[C, m]`` AUROC (:func:`auroc_table`).
        both_signs: a unit may be read negated (its AUROC becomes ``1 - AUROC``): for directions whose sign is
            arbitrary (principal and independent components, random directions); otherwise only as it is.

    Returns:
        ``order`` ``[C, m]`` long (unit indices, the best first; NaN last) and ``sign`` ``[C, m]`` (+1 or -1 per
        unit, in the units' own order).
    """
    sign = torch.where((table < 0.5) & both_signs, -1.0, 1.0).to(table.dtype)
    oriented = torch.where(sign < 0, 1 - table, table)
    oriented = torch.nan_to_num(oriented, nan=-1.0)
    return torch.argsort(oriented, dim=1, descending=True, stable=True), sign


def best_f1_threshold(scores: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """The threshold whose rule ``score >= threshold`` has the highest F1, and that F1 (scikit-learn's
    precision-recall curve).

    Args:
        scores: ``[n]`` one unit's values; labels: ``[n]`` bool, with at least one positive.
    """
    from sklearn.metrics import precision_recall_curve

    precision, recall, thresholds = precision_recall_curve(np.asarray(labels, bool), np.asarray(scores))
    total = precision + recall
    f1 = np.where(total > 0, 2 * precision * recall / np.where(total > 0, total, 1), 0.0)[:-1]  # last: no threshold
    best = int(np.argmax(f1))
    return float(thresholds[best]), float(f1[best])


def f1_at(scores: np.ndarray, labels: np.ndarray, threshold: float) -> float:
    """F1 of the rule ``score >= threshold`` (0 when it finds nothing)."""
    from sklearn.metrics import f1_score

    return float(f1_score(np.asarray(labels, bool), np.asarray(scores) >= threshold, zero_division=0))


def units_needed(fit_units: np.ndarray, fit_labels: np.ndarray, test_units: np.ndarray, test_labels: np.ndarray,
                 order: Sequence[int], target: float = 0.9, cap: int = 32, sign: float = 1.0
                 ) -> tuple[int | None, float]:
    """The fewest of the best units a read-out needs to reach ``target`` AUROC on held-out tokens.

    One unit is read alone (times ``sign``: a one-feature read-out ranks tokens as its unit does); ``n >= 2`` units
    by a logistic regression (features standardised) fitted on the first ``n`` units of ``order`` over the fitting
    tokens. Each is scored by AUROC on the held-out tokens, and the smallest ``n`` that reaches ``target`` is found
    by bisection between one unit and the ``cap`` units, which assumes that adding units to a nested set does not
    lower the AUROC (up to the noise of a fit on thousands of tokens). When the ``cap`` units fall short the answer
    is None.

    Args:
        fit_units: ``[n_fit, m]``; fit_labels: ``[n_fit]`` bool (both classes present).
        test_units: ``[n_test, m]``; test_labels: ``[n_test]`` bool (both classes present).
        order: unit indices, the best single detector first (:func:`ranked_units`).
        target: the AUROC to reach; cap: the most units tried; sign: of the best unit (:func:`ranked_units`).

    Returns:
        ``(n, AUROC with n units)``, or ``(None, AUROC with the cap units)``; ``(None, NaN)`` when every unit of
        ``order`` holds NaN or infinity on some token (such units are passed over).
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    fit_labels, test_labels = np.asarray(fit_labels, bool), np.asarray(test_labels, bool)
    if not (0 < fit_labels.sum() < fit_labels.size and 0 < test_labels.sum() < test_labels.size):
        raise VitscopeValueError("units_needed needs positive and negative tokens in both sets")
    finite = np.isfinite(np.asarray(fit_units)).all(axis=0) & np.isfinite(np.asarray(test_units)).all(axis=0)
    order = [int(i) for i in order if finite[int(i)]][: max(1, cap)]  # a unit with NaN reads nothing
    if not order:
        return None, float("nan")

    def score(n: int) -> float:
        columns = order[:n]
        if n == 1:
            return float(roc_auc_score(test_labels, sign * np.asarray(test_units)[:, columns[0]]))
        model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
        model.fit(np.asarray(fit_units)[:, columns], fit_labels)
        return float(roc_auc_score(test_labels, model.decision_function(np.asarray(test_units)[:, columns])))

    alone = score(1)
    if alone >= target or len(order) == 1:
        return (1, alone) if alone >= target else (None, alone)
    widest = score(len(order))
    if widest < target:
        return None, widest
    low, high, best = 1, len(order), widest  # ``low`` falls short, ``high`` reaches the target
    while high - low > 1:
        middle = (low + high) // 2
        found = score(middle)
        if found >= target:
            high, best = middle, found
        else:
            low = middle
    return high, best
