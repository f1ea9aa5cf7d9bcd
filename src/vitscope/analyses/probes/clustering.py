"""Clustering per block scored by purity, NMI and ARI (paper 002 sections 5.2, 5.3; figures 7, 8, 24 to 27).

docs/methods.md, Representations "Clustering": scikit-learn k-means (``n_init=10``, ``random_state`` passed
explicitly, default 0), k = number of distinct labels unless given. Image level: CLS of the block output
or the mean of its spatial tokens. Object / part level: mean of the spatial tokens weighted by each region
mask resized to the grid (weights sum to 1). Random chance: the same clustering of U(0, 1) features of the
same shape (``random_kind="gaussian"`` for N(0, 1)), seeded, once per run.

Two ways in: the streaming :class:`Clustering` accumulator (``vitscope.run``, standard preprocessing), and
:func:`clustering_probe` on a feature-cache entry (any view, e.g. tiled dense features for regions).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from vitscope.analyses.data_checks import class_problem, region_problem
from vitscope.analyses.probes.base import LabelledFeatures, UnscoredProbeWarning, check_random_kind
from vitscope.analyses.probes.knn import require_finite
from vitscope.analyses.probes.result import ProbeResult, probe_result
from vitscope.analyses.registry import register_analysis
from vitscope.cache.feature_cache import CacheEntry
from vitscope.errors import VitscopeValueError, VitscopeWarning
from vitscope.functional.cluster import cluster_scores, kmeans_labels
from vitscope.functional.pooling import random_features

__all__ = ["Clustering", "clustering_probe", "clustering_scores"]

METRICS = ("purity", "nmi", "ari")


def clustering_scores(blocks: Sequence[int], features: Callable[[int], np.ndarray], labels: np.ndarray,
                      k: int | None = None, seed: int = 0, random_kind: str | None = "uniform",
                      name: str = "clustering", **meta: object) -> ProbeResult:
    """k-means of every block's features scored against ``labels``, plus the random-chance score.

    Args:
        blocks: block numbers; features: ``block -> [n, D]`` features (rows aligned with ``labels``).
        labels: ``[n]`` integer ground truth.
        k: clusters (default: distinct labels); seed: k-means ``random_state`` and random-feature seed.
        random_kind: ``"uniform"``, ``"gaussian"`` or None (no baseline).
        name: result name; meta: stored in ``ProbeResult.meta``.

    Returns:
        ProbeResult with ``purity``, ``nmi``, ``ari`` ``[L]`` and their ``random_*``.
    """
    labels = np.asarray(labels, dtype=np.int64)
    k = int(k) if k is not None else int(np.unique(labels).size)
    if labels.size and k >= labels.size:
        import warnings

        warnings.warn(f"{name}: {labels.size} rows in {k} clusters give every row a cluster of its own, so purity, "
                      "NMI and ARI say nothing about the features (random chance scores the same); use more "
                      "images than classes", VitscopeWarning, stacklevel=2)
    k = min(k, labels.size)
    scores: dict[str, list[float]] = {m: [] for m in METRICS}
    width = 0
    label = f"{name} ({meta['pooling']})" if meta.get("pooling") else name
    for b in blocks:
        x = np.asarray(features(b), dtype=np.float32)
        require_finite(x, f"{label}: block {b}'s features")
        width = x.shape[1]
        s = cluster_scores(labels, kmeans_labels(x, k, seed))
        for m in METRICS:
            scores[m].append(s[m])
    random = None
    if random_kind is not None and blocks:
        noise = random_features((labels.size, width), torch.Generator().manual_seed(seed), random_kind)
        random = cluster_scores(labels, kmeans_labels(noise.numpy(), k, seed))
    meta.setdefault("num_rows", int(labels.size))
    return probe_result(name, "clustering", list(blocks), scores, random, k=k, seed=seed,
                        random_kind=random_kind, **meta)


@register_analysis("clustering", groups=("representation", "probes"), order=120)
class Clustering(LabelledFeatures):
    """Per-block k-means clustering of image (or region) features, scored against the labels.

    Args:
        site: block site (default ``resid_post``, the block output).
        tokens: image level: ``"auto"`` (default: the CLS token where the model has
            one, else the spatial mean), ``"cls"`` or ``"spatial_mean"``.
        level: ``"image"`` (batch targets ``label``), ``"object"`` or ``"part"`` (one row per region mask: the
            data's region masks and their labels, which the engine loads, e.g. ``--data ROOT::coco`` or
            ``ROOT::partimagenet``).
        k: number of clusters (default: the number of distinct labels).
        seed: k-means ``random_state`` and seed of the random baseline.
        random_kind: random-chance features, ``"uniform"`` (default), ``"gaussian"`` or None.
        workdir: folder for spilled features.

    Result: :class:`ProbeResult` with ``purity``, ``nmi``, ``ari`` ``[L]`` and ``random_*``.
    """

    description = ("k-means of each block's image features scored against the class labels (purity, NMI, ARI); the "
                   "dashed line is random chance.")
    summary = "per-block k-means against labels"

    task = "clustering"

    def __init__(self, site: str = "resid_post", tokens: str = "auto", level: str = "image", k: int | None = None,
                 seed: int = 0, random_kind: str | None = "uniform", workdir: str | Path | None = None) -> None:
        super().__init__(site, tokens, level, workdir)
        if k is not None and (int(k) != k or k < 1):
            raise VitscopeValueError(f"k must be a positive integer, got {k!r}")
        self._cfg_k, self._cfg_seed, self._cfg_random = k, int(seed), check_random_kind(random_kind)

    def compute(self) -> ProbeResult:
        meta = self.base_meta()
        if len(self.store) == 0:
            return ProbeResult(self.name, {}, {**meta, "metrics": list(METRICS)})
        index, labels, feats = self.rows()
        problem = self.rows_problem(index, labels)
        if problem:
            return self.refused(problem, METRICS)
        meta.pop("blocks")
        meta.pop("task")
        return clustering_scores(self.blocks, feats.__getitem__, labels, self._cfg_k, self._cfg_seed,
                                 self._cfg_random, self.name, **meta)


def clustering_probe(entry: CacheEntry, labels: np.ndarray | None = None, k: int | None = None, seed: int = 0,
                     random_kind: str | None = "uniform", blocks: Sequence[int] | None = None,
                     model: str = "") -> ProbeResult:
    """Clustering scores per block from cached features (image level, or region rows of a ``"mask"`` entry).

    Args:
        entry: cache entry from :func:`vitscope.engine.extract.extract_features`.
        labels: ``[rows]`` labels aligned with the entry's rows; default: its ``label`` column (mask pooling).
        k, seed, random_kind: as :func:`clustering_scores`.
        blocks: blocks to score (default: every cached block).
        model: model name for the result.

    Returns:
        ProbeResult (``purity``, ``nmi``, ``ari`` per block, with random chance); rows of fewer than two classes
        (image or region level) or no more regions than classes give no numbers and the reason in ``meta["error"]``.
    """
    if labels is None:
        if "label" not in entry.columns:
            raise VitscopeValueError("this cache entry has no label column; pass labels (one per row, in index order)")
        labels = np.asarray(entry.array("label"))
    labels = np.asarray(labels)
    if labels.shape != (len(entry),):
        raise VitscopeValueError(f"{labels.shape[0] if labels.ndim else 0} labels for {len(entry)} cached rows")
    keep = labels >= 0  # -1 marks an unlabelled image
    blocks = list(blocks) if blocks is not None else entry.blocks
    pooling = entry.meta.get("request", {}).get("pooling", "")
    # the rows kept (a limit, unreadable images, a one-class test set) may be too few to say anything: one class
    # scores 1.0, and so does its random chance (one row per class is only warned of, by clustering_scores)
    classes = int(np.unique(labels[keep]).size)
    if pooling == "mask":
        problem = region_problem(int(keep.sum()), classes)
    else:
        problem = class_problem(labels[keep], "the images to cluster") if classes < 2 else None
    if problem:
        warnings.warn(f"clustering: {problem}", UnscoredProbeWarning, stacklevel=2)
        return ProbeResult("clustering", {}, {"model": model, "pooling": pooling, "num_rows": int(keep.sum()),
                                              "metrics": list(METRICS), "error": problem})
    return clustering_scores(blocks, lambda b: np.asarray(entry.block(b))[keep], labels[keep], k, seed, random_kind,
                             model=model, pooling=pooling, view=entry.meta.get("view", {}).get("view", ""))
