"""k-NN classification per block (paper 002 section 6, figure 9 left; docs/methods.md, Probes per block "k-NN").

L2-normalised features, cosine similarity, k = 20, votes ``exp(sim / 0.07)``
(:func:`vitscope.functional.knn_classify`). Random chance: the same classifier on U(0, 1) features of the
same shapes (seeded, once per run).

Two ways in: :func:`knn_probe` on cached features of a training set and a test set (the paper's protocol),
and the streaming :class:`KnnProbe` accumulator, which holds out a deterministic fraction of one labelled
stream as the test set (:func:`vitscope.analyses.probes.base.holdout_mask`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from vitscope.analyses.data_checks import split_problem
from vitscope.analyses.probes.base import LabelledFeatures, cached_labelled_pair, check_random_kind, holdout_mask
from vitscope.analyses.probes.result import ProbeResult, probe_result
from vitscope.analyses.registry import register_analysis
from vitscope.cache.feature_cache import CacheEntry
from vitscope.errors import VitscopeValueError
from vitscope.functional.knn import knn_classify
from vitscope.functional.pooling import random_features

__all__ = ["KnnProbe", "knn_probe", "knn_scores", "require_finite"]


def _accuracy(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray, k: int,
              temperature: float, num_classes: int) -> float:
    if test_y.size == 0 or train_y.size == 0:
        return math.nan
    pred = knn_classify(torch.as_tensor(np.array(train_x, dtype=np.float32)), torch.as_tensor(train_y),
                        torch.as_tensor(np.array(test_x, dtype=np.float32)), k=k, temperature=temperature,
                        num_classes=num_classes)
    return float((pred.numpy() == test_y).mean())


def require_finite(x: np.ndarray, what: str) -> None:
    """Refuse features with NaN or infinite values, naming them (``what``: e.g. ``"knn_cls: block 3's train
    features"``): a model whose activations overflow gives them, and no probe can score them."""
    if not np.isfinite(np.asarray(x)).all():
        raise VitscopeValueError(f"{what} contain NaN or infinite values, which the probes cannot score (a model "
                                 "whose activations overflow gives them, e.g. under fp16)")


def knn_scores(blocks: Sequence[int], features: Callable[[int], tuple[np.ndarray, np.ndarray]], train_y: np.ndarray,
               test_y: np.ndarray, k: int = 20, temperature: float = 0.07, seed: int = 0,
               random_kind: str | None = "uniform", name: str = "knn_probe", **meta: object) -> ProbeResult:
    """Top-1 k-NN accuracy of every block, plus the random-chance accuracy.

    Args:
        blocks: block numbers; features: ``block -> (train [n, D], test [m, D])``.
        train_y: ``[n]`` labels; test_y: ``[m]`` labels.
        k, temperature: the classifier's settings (default 20 and 0.07).
        seed: seed of the random features; random_kind: ``"uniform"``, ``"gaussian"`` or None.
        name: result name; meta: stored in the result.

    Returns:
        ProbeResult with ``accuracy`` ``[L]`` and ``random_accuracy``; its ``k`` is the ``k`` asked for and
        ``k_used`` the number of neighbours that voted (``k``, or every training image when there are fewer).

    Raises:
        VitscopeValueError: a block's features hold NaN or infinite values (the message names the block).
    """
    train_y, test_y = np.asarray(train_y, dtype=np.int64), np.asarray(test_y, dtype=np.int64)
    num_classes = int(max(train_y.max(initial=0), test_y.max(initial=0))) + 1
    acc, width = [], 0
    label = f"{name} ({meta['pooling']})" if meta.get("pooling") else name
    for b in blocks:
        tr, te = features(b)
        width = np.asarray(tr).shape[1]
        for side, x in (("train", tr), ("test", te)):
            require_finite(x, f"{label}: block {b}'s {side} features")
        acc.append(_accuracy(tr, train_y, te, test_y, k, temperature, num_classes))
    random = None
    if random_kind is not None and blocks:
        gen = torch.Generator().manual_seed(seed)
        tr = random_features((train_y.size, width), gen, random_kind).numpy()
        te = random_features((test_y.size, width), gen, random_kind).numpy()
        random = {"accuracy": _accuracy(tr, train_y, te, test_y, k, temperature, num_classes)}
    # the classifier lets every training image vote when there are fewer than k: record the neighbours that voted
    used = min(int(k), int(train_y.size)) if train_y.size else int(k)
    return probe_result(name, "knn", list(blocks), {"accuracy": acc}, random, k=int(k), k_used=used,
                        temperature=temperature,
                        num_train=int(train_y.size), num_test=int(test_y.size), seed=seed, random_kind=random_kind,
                        **meta)


@register_analysis("knn_probe", groups=("probes",), order=130)
class KnnProbe(LabelledFeatures):
    """Per-block k-NN accuracy on a held-out part of one labelled image stream.

    Args:
        site: block site (default ``resid_post``); tokens: ``"auto"`` (default: the CLS token where the model has
            one, else the spatial mean), ``"cls"`` or ``"spatial_mean"``.
        k: neighbours (20); temperature: vote temperature (0.07).
        test_fraction: share of images held out for testing (by a seeded hash of the dataset index).
        seed: split and random-baseline seed; random_kind: ``"uniform"``, ``"gaussian"`` or None.
        workdir: folder for spilled features.

    Result: :class:`ProbeResult` with ``accuracy`` ``[L]`` and ``random_accuracy``.
    """

    description = ("k-NN classification accuracy of each block's CLS features on held-out images (k = 20, cosine, "
                   "temperature 0.07); the dashed line is random chance.")
    summary = "per-block k-NN accuracy"

    task = "knn"

    def __init__(self, site: str = "resid_post", tokens: str = "auto", k: int = 20, temperature: float = 0.07,
                 test_fraction: float = 0.2, seed: int = 0, random_kind: str | None = "uniform",
                 workdir: str | Path | None = None) -> None:
        super().__init__(site, tokens, "image", workdir)
        if isinstance(k, bool) or int(k) != k or k < 1:
            raise VitscopeValueError(f"k must be a positive integer (neighbours voting), got {k!r}")
        if not temperature > 0:
            raise VitscopeValueError(f"temperature must be positive, got {temperature!r}")
        if not 0 < test_fraction < 1:
            raise VitscopeValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
        self._cfg_k, self._cfg_t, self._cfg_fraction = int(k), float(temperature), float(test_fraction)
        self._cfg_seed, self._cfg_random = int(seed), check_random_kind(random_kind)

    def split_problem(self, index: np.ndarray) -> str | None:
        """Why the held-out split leaves the train or the test side empty (:func:`.data_checks.split_problem`)."""
        return split_problem(holdout_mask(index, self._cfg_fraction, self._cfg_seed), self._cfg_fraction)

    def compute(self) -> ProbeResult:
        meta = self.base_meta()
        if len(self.store) == 0:
            return ProbeResult(self.name, {}, {**meta, "metrics": ["accuracy"]})
        index, labels, feats = self.rows()
        problem = self.rows_problem(index, labels)
        if problem:
            return self.refused(problem, ["accuracy"])
        test = holdout_mask(index, self._cfg_fraction, self._cfg_seed)
        for key in ("blocks", "task"):
            meta.pop(key)
        return knn_scores(self.blocks, lambda b: (feats[b][~test], feats[b][test]), labels[~test], labels[test],
                          self._cfg_k, self._cfg_t, self._cfg_seed, self._cfg_random, self.name,
                          test_fraction=self._cfg_fraction, **meta)


def knn_probe(train: CacheEntry, train_labels: np.ndarray, test: CacheEntry, test_labels: np.ndarray, k: int = 20,
              temperature: float = 0.07, seed: int = 0, random_kind: str | None = "uniform",
              blocks: Sequence[int] | None = None, model: str = "") -> ProbeResult:
    """k-NN accuracy per block from cached features of a training and a test set.

    Args:
        train: cache entry of the training images; train_labels: ``[n_images]`` labels by image position
            (rows are looked up through the entry's ``index``; -1 = unlabelled, left out).
        test: cache entry of the test images; test_labels: their labels by image position.
        k, temperature, seed, random_kind: as :func:`knn_scores`.
        blocks: blocks to score (default: those both entries hold); model: model name for the result.

    Returns:
        ProbeResult with ``accuracy`` per block and ``random_accuracy``.
    """
    blocks, features, ytr, yte, pooling = cached_labelled_pair(train, train_labels, test, test_labels, blocks)
    return knn_scores(blocks, features, ytr, yte, k, temperature, seed, random_kind, model=model, pooling=pooling)
