"""Linear probe per block on frozen CLS or spatial-mean features (paper 002 appendix E.4, table 6).

Logistic regression with optional batch norm (:mod:`vitscope.functional.linear_probe`, plain torch,
deterministic for a seed). Random chance: the same probe trained and tested on U(0, 1) features of the
same shapes. :func:`linear_probe` works on cached training / test features; :class:`LinearProbe` is the
streaming accumulator with a deterministic held-out split (as :class:`KnnProbe`).
"""

from __future__ import annotations

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
from vitscope.functional.linear_probe import linear_probe_accuracy
from vitscope.functional.pooling import random_features

__all__ = ["LinearProbe", "linear_probe", "linear_scores"]


def linear_scores(blocks: Sequence[int], features: Callable[[int], tuple[np.ndarray, np.ndarray]],
                  train_y: np.ndarray, test_y: np.ndarray, batch_norm: bool = False, epochs: int = 20,
                  lr: float = 0.1, batch_size: int = 256, seed: int = 0, random_kind: str | None = "uniform",
                  name: str = "linear_probe", **meta: object) -> ProbeResult:
    """Test accuracy of a linear probe trained on every block's features, plus the random-chance accuracy.

    Args:
        blocks: block numbers; features: ``block -> (train [n, D], test [m, D])``.
        train_y: ``[n]`` labels; test_y: ``[m]`` labels.
        batch_norm, epochs, lr, batch_size, seed: the probe's training settings.
        random_kind: ``"uniform"``, ``"gaussian"`` or None; name, meta: for the result.

    Returns:
        ProbeResult with ``accuracy`` ``[L]`` and ``random_accuracy``.
    """
    train_y, test_y = np.asarray(train_y, dtype=np.int64), np.asarray(test_y, dtype=np.int64)
    opts = {"batch_norm": batch_norm, "epochs": epochs, "lr": lr, "batch_size": batch_size, "seed": seed}

    def accuracy(tr: np.ndarray, te: np.ndarray) -> float:
        if train_y.size == 0:
            return float("nan")
        return linear_probe_accuracy(torch.as_tensor(np.array(tr, dtype=np.float32)), torch.as_tensor(train_y),
                                     torch.as_tensor(np.array(te, dtype=np.float32)), torch.as_tensor(test_y), **opts)

    acc, width = [], 0
    for b in blocks:
        tr, te = features(b)
        width = np.asarray(tr).shape[1]
        acc.append(accuracy(tr, te))
    random = None
    if random_kind is not None and blocks:
        gen = torch.Generator().manual_seed(seed)
        tr = random_features((train_y.size, width), gen, random_kind).numpy()
        random = {"accuracy": accuracy(tr, random_features((test_y.size, width), gen, random_kind).numpy())}
    return probe_result(name, "linear", list(blocks), {"accuracy": acc}, random, num_train=int(train_y.size),
                        num_test=int(test_y.size), random_kind=random_kind, **opts, **meta)


@register_analysis("linear_probe", groups=("probes",), order=140)
class LinearProbe(LabelledFeatures):
    """Per-block linear-probe accuracy on a held-out part of one labelled image stream.

    Args:
        site: block site; tokens: ``"auto"`` (default: the CLS token where the model has
            one, else the spatial mean), ``"cls"`` or ``"spatial_mean"``.
        batch_norm: batch norm (no affine) before the linear layer, as MAE's recipe.
        epochs, lr, batch_size: training settings (Adam, cosine schedule).
        test_fraction: share of images held out (seeded hash of the dataset index).
        seed: split, initialisation, shuffling and random-baseline seed.
        random_kind: ``"uniform"``, ``"gaussian"`` or None; workdir: folder for spilled features.

    Result: :class:`ProbeResult` with ``accuracy`` ``[L]`` and ``random_accuracy``.
    """

    description = ("Linear probe accuracy of each block's CLS features on held-out images; the dashed line is random "
                   "chance.")
    summary = "per-block linear-probe accuracy"

    task = "linear"

    def __init__(self, site: str = "resid_post", tokens: str = "auto", batch_norm: bool = False, epochs: int = 20,
                 lr: float = 0.1, batch_size: int = 256, test_fraction: float = 0.2, seed: int = 0,
                 random_kind: str | None = "uniform", workdir: str | Path | None = None) -> None:
        super().__init__(site, tokens, "image", workdir)
        if not 0 < test_fraction < 1:
            raise VitscopeValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
        for key, value in (("epochs", epochs), ("batch_size", batch_size)):
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise VitscopeValueError(f"{key} must be a positive integer, got {value!r}")
        if not 0 < lr < float("inf"):
            raise VitscopeValueError(f"lr must be a positive learning rate, got {lr!r}")
        self._cfg_opts = {"batch_norm": bool(batch_norm), "epochs": int(epochs), "lr": float(lr),
                          "batch_size": int(batch_size), "seed": int(seed)}
        self._cfg_fraction, self._cfg_random = float(test_fraction), check_random_kind(random_kind)

    def split_problem(self, index: np.ndarray) -> str | None:
        """Why the held-out split leaves the train or the test side empty (:func:`.data_checks.split_problem`)."""
        return split_problem(holdout_mask(index, self._cfg_fraction, self._cfg_opts["seed"]), self._cfg_fraction)

    def compute(self) -> ProbeResult:
        meta = self.base_meta()
        if len(self.store) == 0:
            return ProbeResult(self.name, {}, {**meta, "metrics": ["accuracy"]})
        index, labels, feats = self.rows()
        problem = self.rows_problem(index, labels)
        if problem:
            return self.refused(problem, ["accuracy"])
        test = holdout_mask(index, self._cfg_fraction, self._cfg_opts["seed"])
        for key in ("blocks", "task"):
            meta.pop(key)
        return linear_scores(self.blocks, lambda b: (feats[b][~test], feats[b][test]), labels[~test], labels[test],
                             random_kind=self._cfg_random, name=self.name, test_fraction=self._cfg_fraction,
                             **self._cfg_opts, **meta)


def linear_probe(train: CacheEntry, train_labels: np.ndarray, test: CacheEntry, test_labels: np.ndarray,
                 batch_norm: bool = False, epochs: int = 20, lr: float = 0.1, batch_size: int = 256, seed: int = 0,
                 random_kind: str | None = "uniform", blocks: Sequence[int] | None = None,
                 model: str = "") -> ProbeResult:
    """Linear-probe accuracy per block from cached training and test features (labels by image position).

    Args:
        train, test: cache entries (pooling ``"cls"`` or ``"spatial_mean"``); train_labels, test_labels:
            ``[n_images]`` labels by image position (-1 = unlabelled, left out).
        batch_norm, epochs, lr, batch_size, seed, random_kind: as :func:`linear_scores`.
        blocks: blocks to score (default: those both entries hold); model: model name for the result.

    Returns:
        ProbeResult with ``accuracy`` per block and ``random_accuracy``.
    """
    blocks, features, ytr, yte, pooling = cached_labelled_pair(train, train_labels, test, test_labels, blocks)
    return linear_scores(blocks, features, ytr, yte, batch_norm, epochs, lr, batch_size, seed, random_kind,
                         model=model, pooling=pooling)
