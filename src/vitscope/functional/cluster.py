"""Clustering of features and its scores (docs/methods.md, Representations, "Clustering").

Pure functions: no I/O, no plotting, no global state. k-means is scikit-learn's ``KMeans`` with
``n_init=10`` and the seed passed explicitly as ``random_state``, as the 002 code.
"""

from __future__ import annotations

import numpy as np
import torch

from vitscope.errors import VitscopeValueError

# scikit-learn is imported where it is used: importing it costs about a second at every start-up

__all__ = ["cluster_scores", "kmeans_labels", "purity"]

ArrayLike = np.ndarray | torch.Tensor


def _labels(values: ArrayLike, name: str) -> np.ndarray:
    """1-D integer labels from a numpy array or a torch tensor."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise VitscopeValueError(f"{name} must be a 1-D array of integer labels [n], got shape {arr.shape}")
    if arr.dtype == bool:
        return arr.astype(np.int64)
    if not np.issubdtype(arr.dtype, np.integer):
        if np.issubdtype(arr.dtype, np.floating) and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            return arr.astype(np.int64)
        raise VitscopeValueError(f"{name} must hold integer labels, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _pair(labels_true: ArrayLike, labels_pred: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    t, p = _labels(labels_true, "labels_true"), _labels(labels_pred, "labels_pred")
    if t.shape != p.shape:
        raise VitscopeValueError(f"labels_true and labels_pred must have the same length, got {t.size} and {p.size}")
    if t.size == 0:
        raise VitscopeValueError("cannot score an empty clustering (0 labels)")
    return t, p


def purity(labels_true: ArrayLike, labels_pred: ArrayLike) -> float:
    """Cluster purity: each predicted cluster votes its majority true label.

    ``purity = (1/n) * sum_clusters max_label |cluster ∩ label|``.

    Args:
        labels_true: ``[n]`` integer ground-truth labels (numpy or torch).
        labels_pred: ``[n]`` integer cluster ids.

    Returns:
        Purity in (0, 1].
    """
    t, p = _pair(labels_true, labels_pred)
    from sklearn.metrics.cluster import contingency_matrix

    table = contingency_matrix(t, p)  # [n_labels, n_clusters]
    return float(table.max(axis=0).sum() / t.size)


def cluster_scores(labels_true: ArrayLike, labels_pred: ArrayLike) -> dict[str, float]:
    """Purity, NMI (arithmetic mean normalisation) and ARI of a clustering.

    Args:
        labels_true: ``[n]`` integer ground-truth labels (numpy or torch).
        labels_pred: ``[n]`` integer cluster ids (any integers; only the partition matters).

    Returns:
        ``{"purity": ..., "nmi": ..., "ari": ...}`` as Python floats. A perfect clustering gives 1, 1, 1.
    """
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    t, p = _pair(labels_true, labels_pred)
    return {
        "purity": purity(t, p),
        "nmi": float(normalized_mutual_info_score(t, p, average_method="arithmetic")),
        "ari": float(adjusted_rand_score(t, p)),
    }


def kmeans_labels(features: ArrayLike, k: int, seed: int = 0) -> np.ndarray:
    """k-means cluster ids with scikit-learn ``KMeans(n_clusters=k, n_init=10, random_state=seed)``.

    Args:
        features: ``[n, d]`` features (numpy or torch). float32 stays float32, anything else becomes float64.
        k: number of clusters, 1 <= k <= n (docs/methods.md default: the number of distinct labels).
        seed: passed as ``random_state`` (default 0, as the 002 code), taken modulo 2**32 (scikit-learn's range), so
            any integer works (``-1`` seeds as ``2**32 - 1``).

    Returns:
        ``[n]`` int64 numpy array of cluster ids in ``[0, k)``.
    """
    if isinstance(features, torch.Tensor):
        features = features.detach().cpu().numpy()
    x = np.asarray(features)
    if x.ndim != 2:
        raise VitscopeValueError(f"features must be [n, d], got shape {x.shape}")
    if x.dtype != np.float32:
        x = x.astype(np.float64)
    if not np.all(np.isfinite(x)):
        raise VitscopeValueError("features contain NaN or infinite values")
    if int(k) != k or not 1 <= k <= x.shape[0]:
        raise VitscopeValueError(f"k must be an integer in [1, n={x.shape[0]}], got {k!r}")
    from sklearn.cluster import KMeans

    model = KMeans(n_clusters=int(k), n_init=10, random_state=int(seed) % 2**32)
    return model.fit_predict(x).astype(np.int64)
