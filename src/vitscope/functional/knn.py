"""Weighted k-nearest-neighbour classification (docs/methods.md, Probes per block, "k-NN"; the DINO ``eval_knn`` code).

Pure tensor functions: no I/O, no plotting, no global state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vitscope.errors import VitscopeTypeError, VitscopeValueError
from vitscope.functional.knn_search import knn_search

__all__ = ["knn_classify"]


def _features(x: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise VitscopeTypeError(f"{name} must be a torch.Tensor [n, d], got {type(x).__name__}")
    if x.dim() != 2:
        raise VitscopeValueError(f"{name} must be [n, d], got shape {tuple(x.shape)}")
    x = x.detach()
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    x = x.to(dtype)
    if not bool(torch.isfinite(x).all()):  # NaN similarities would rank arbitrarily and vote for class 0
        raise VitscopeValueError(f"{name} contain NaN or infinite values, which k-NN cannot rank")
    return x


def knn_classify(
    train_feats: torch.Tensor,
    train_labels: torch.Tensor,
    test_feats: torch.Tensor,
    k: int = 20,
    temperature: float = 0.07,
    num_classes: int | None = None,
    chunk_size: int = 1024,
    bank_tile: int = 32768,
) -> torch.Tensor:
    """Predict test labels by weighted votes of the k most similar training examples.

    As the DINO ``knn_classifier``: both feature sets are L2-normalised, similarity is the cosine, the
    k most similar training rows vote for their label with weight ``exp(sim / temperature)``, and the
    class with the largest summed vote wins. Votes are summed in float64; a tie between classes goes
    to the lowest label index. Which of several training rows of equal similarity at the k-th place
    votes is the one ``torch.topk`` picks within a tile, then the lowest position. The neighbours are
    found by :func:`~vitscope.functional.knn_search.knn_search`: ``chunk_size x bank_tile`` similarities
    at a time, so memory does not grow with the training set.

    Args:
        train_feats: ``[n_train, d]`` training features.
        train_labels: ``[n_train]`` integer labels in ``[0, num_classes)``.
        test_feats: ``[n_test, d]`` features to classify.
        k: number of neighbours; clamped to ``n_train`` when larger.
        temperature: vote temperature T (votes ``exp(sim / T)``), default 0.07.
        num_classes: number of classes; default ``max(train_labels) + 1``.
        chunk_size: test rows per tile.
        bank_tile: training rows per tile.

    Returns:
        ``[n_test]`` int64 predicted labels (on the device of ``test_feats``).

    Raises:
        VitscopeValueError: NaN or infinite features, mismatched shapes or labels, bad settings.
    """
    train = _features(train_feats, "train_feats")
    test = _features(test_feats, "test_feats")
    if not isinstance(train_labels, torch.Tensor):
        train_labels = torch.as_tensor(train_labels)
    labels = train_labels.detach().reshape(-1)
    if labels.dtype.is_floating_point or labels.dtype == torch.bool or labels.is_complex():
        raise VitscopeValueError(f"train_labels must be integer labels, got dtype {labels.dtype}")
    labels = labels.to(device=train.device, dtype=torch.int64)
    n_train = train.shape[0]
    if labels.numel() != n_train:
        raise VitscopeValueError(f"train_labels has {labels.numel()} entries for {n_train} training rows")
    if n_train == 0:
        raise VitscopeValueError("k-NN needs at least one training example")
    if train.shape[1] != test.shape[1]:
        raise VitscopeValueError(f"feature sizes differ: train d={train.shape[1]}, test d={test.shape[1]}")
    if int(k) != k or k < 1:
        raise VitscopeValueError(f"k must be a positive integer, got {k!r}")
    if not temperature > 0:
        raise VitscopeValueError(f"temperature must be > 0, got {temperature!r}")
    if int(chunk_size) != chunk_size or chunk_size < 1:
        raise VitscopeValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    if int(labels.min()) < 0:
        raise VitscopeValueError("train_labels must be >= 0")
    if num_classes is None:
        num_classes = int(labels.max()) + 1
    elif int(labels.max()) >= num_classes:
        raise VitscopeValueError(f"train_labels go up to {int(labels.max())}, beyond num_classes={num_classes}")

    k = min(int(k), n_train)
    dtype = torch.promote_types(train.dtype, test.dtype)
    train = F.normalize(train.to(dtype), dim=1)
    test = F.normalize(test.to(dtype=dtype, device=train.device), dim=1)

    if test.shape[0] == 0:
        return torch.zeros(0, dtype=torch.int64, device=test_feats.device)
    # blocked search: chunk_size x bank_tile similarities at a time, never chunk_size x n_train
    top_sim, top_idx = knn_search(test, train, k, metric="ip", query_tile=int(chunk_size), bank_tile=bank_tile)
    # exp((sim - the query's best) / T): the same votes up to a factor per query, without overflow at small T
    sims = top_sim.to(torch.float64)
    weights = ((sims - sims.max(dim=1, keepdim=True).values) / temperature).exp()  # [n_test, k]
    votes = torch.zeros(top_sim.shape[0], num_classes, dtype=torch.float64, device=train.device)
    votes.scatter_add_(1, labels[top_idx], weights)
    return votes.argmax(dim=1).to(test_feats.device)  # first maximum -> lowest label on ties
