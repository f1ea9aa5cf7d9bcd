"""The units an SAE's latents are compared with, all fitted on the same tokens: principal components, independent
components, k-means centroids and random directions (scikit-learn's PCA, FastICA and KMeans).

Each method becomes a function from tokens ``[n, D]`` to unit values ``[n, m]``: the projections on the principal or
independent components, the closeness to each centroid (minus the Euclidean distance) and the projections of the
centred tokens on random unit directions.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vitscope.errors import VitscopeValueError

__all__ = ["BASELINES", "Fitted", "fit_baseline"]

#: the baselines fitted on the hook's tokens (the model's neurons are read from the model, not fitted)
BASELINES = ("pca", "ica", "kmeans", "random")


@dataclass
class Fitted:
    """One fitted method.

    Attributes:
        units: tokens ``[n, D]`` float32 -> unit values ``[n, m]`` float32.
        count: ``m``; notes: what the fit reports (e.g. whether ICA converged, the variance PCA explains).
    """

    units: Callable[[np.ndarray], np.ndarray]
    count: int
    notes: dict[str, Any] = field(default_factory=dict)


def _warned(fit: Callable[[], Any]) -> tuple[Any, list[str]]:
    """``fit()`` and the warnings it raised (a convergence warning is a note, not a failure)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = fit()
    return value, sorted({str(w.message).splitlines()[0] for w in caught})


def fit_baseline(method: str, tokens: np.ndarray, count: int, seed: int) -> Fitted:
    """Fit ``method`` (one of :data:`BASELINES`) on ``tokens``.

    Args:
        method: ``pca`` / ``ica`` (``min(count, D, n)`` components), ``kmeans`` (``count`` centroids, one
            initialisation) or ``random`` (``count`` Gaussian directions of unit norm).
        tokens: ``[n, D]`` float32 fitting tokens.
        count: units wanted; seed: of the fit's randomness.
    """
    from sklearn.cluster import KMeans
    from sklearn.decomposition import PCA, FastICA

    n, d = tokens.shape
    x = np.asarray(tokens, dtype=np.float32)
    if method == "pca":
        pca = PCA(n_components=min(count, d, n), random_state=seed).fit(x)
        return Fitted(lambda t: pca.transform(t).astype(np.float32), pca.n_components_,
                      {"explained_variance": float(pca.explained_variance_ratio_.sum())})
    if method == "ica":
        ica, said = _warned(lambda: FastICA(n_components=min(count, d, n), whiten="unit-variance", max_iter=400,
                                            random_state=seed).fit(x))
        return Fitted(lambda t: ica.transform(t).astype(np.float32), ica.components_.shape[0],
                      {"iterations": int(ica.n_iter_), "warnings": said})
    if method == "kmeans":
        km, said = _warned(lambda: KMeans(n_clusters=min(count, n), n_init=1, random_state=seed).fit(x))
        return Fitted(lambda t: -km.transform(t).astype(np.float32), km.n_clusters,
                      {"iterations": int(km.n_iter_), "warnings": said})
    if method == "random":
        directions = np.random.default_rng(seed).standard_normal((d, count)).astype(np.float32)
        directions /= np.linalg.norm(directions, axis=0, keepdims=True)
        centre = x.mean(axis=0)
        return Fitted(lambda t: ((t - centre) @ directions).astype(np.float32), count)
    raise VitscopeValueError(f"unknown baseline {method!r}; baselines: {', '.join(BASELINES)}")
