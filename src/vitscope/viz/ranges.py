"""Bounded quantities: the documented range of each, so every chart and figure file draws it on that range.

A colour scale or value axis taken from the data makes the smallest value look like the worst one: a CKA
matrix from 0.886 to 1 drawn from its minimum shows 0.886 darkest. Quantities with a documented range (CKA, IoU,
accuracies, probe scores, shares) are drawn on it instead, and the legend notes the range the data spans
(``data 0.886–1.000``), so neither the place on the scale nor the spread is lost.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["PROBE_RANGE", "RANGES", "bar_label", "data_range", "legend_note", "quantity_range", "range_note"]

#: ``(pattern, (low, high))``: the documented range of every quantity whose key (or label) matches the pattern
#: (case-insensitive, the whole key, after a ``random_`` prefix is dropped); the first match wins
RANGES: tuple[tuple[str, tuple[float, float]], ...] = (
    (r"(.*[ _])?cka([ _].*)?", (0.0, 1.0)),  # linear CKA (the unbiased estimator may dip just below 0)
    (r"(.*[ _])?iou([ _].*)?", (0.0, 1.0)),  # saliency IoU, best-head IoU
    (r"(.*[ _])?accuracy", (0.0, 1.0)),  # k-NN, linear probe, top-1, token accuracies (not "normalised_accuracy")
    (r"map(_.*|@r)?|r@\d+|pck@.*|j|f|j&f|(clustering_)?(purity|nmi)", (0.0, 1.0)),  # probe scores
    (r"(clustering_)?ari", (-0.5, 1.0)),  # the adjusted Rand index lies in [-1/2, 1]
    (r"kk|kn|nk|nn|(.*[ _])?share|rho|max_attention", (0.0, 1.0)),  # shares of patches, masks, attention mass
    (r"(entropy|focus)_normalised", (0.0, 1.0)),  # entropy / log N, focus index / log K
)
#: the range of a probe score the table does not name (every probe score lies in [0, 1] but ARI)
PROBE_RANGE: tuple[float, float] = (0.0, 1.0)
_UNBOUNDED = re.compile(r"normalised_accuracy|.*_change")  # accuracy over the full-image one, differences


def quantity_range(quantity: str) -> tuple[float, float] | None:
    """The documented ``(low, high)`` of a quantity, or None when it has none (distances, entropies, norms).

    Args:
        quantity: its key or metric name as results.json spells it (``cka``, ``cls_iou``, ``knn_accuracy``,
            ``mAP_medium``, ``PCK@0.1``, ``KK``...); a ``random_`` prefix (the random baseline of the same
            quantity) is dropped.
    """
    key = quantity.strip().lower().removeprefix("random_")
    if _UNBOUNDED.fullmatch(key):
        return None
    return next((bounds for pattern, bounds in RANGES if re.fullmatch(pattern, key)), None)


def data_range(values: Any) -> tuple[float, float] | None:
    """``(min, max)`` of the finite numbers in ``values`` (nested lists, arrays, tensors; None entries skipped),
    or None when there is none."""
    flat = [float(v) for v in _numbers(values) if v is not None and math.isfinite(float(v))]
    return (min(flat), max(flat)) if flat else None


def _numbers(values: Any) -> Iterable[Any]:
    if hasattr(values, "detach"):  # a tensor
        values = values.detach().cpu().double().numpy()
    if isinstance(values, np.ndarray):
        return values.reshape(-1).tolist()
    if isinstance(values, (list, tuple)):
        return [v for item in values for v in _numbers(item)]
    return [values]


def range_note(span: tuple[float, float] | None) -> str:
    """What a legend says of the data on a fixed scale: ``"data 0.886–1.000"`` (``""`` without data); three
    decimals for values within ±1000, else four significant digits."""
    if span is None:
        return ""
    lo, hi = span
    fmt = "{:.3f}" if max(abs(lo), abs(hi)) < 1000 else "{:.4g}"
    return f"data {fmt.format(lo)}–{fmt.format(hi)}"


def bar_label(label: str, values: Any) -> str:
    """The colour-bar label of a heat map on a fixed scale: ``"CKA (data 0.886–1.000)"``."""
    note = range_note(data_range(values))
    return f"{label} ({note})" if note else label


def legend_note(ax: Any, values: Any) -> None:
    """Add the data's range to the legend of ``ax`` (a matplotlib axis on a fixed range) as an entry without a
    mark; call it before the legend is drawn."""
    note = range_note(data_range(values))
    if note:
        ax.plot([], [], " ", label=note)
