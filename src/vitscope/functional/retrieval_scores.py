"""Retrieval scores (docs/methods.md, Probes per block, "Retrieval" and "Recall@k / mAP@R").

Pure functions: no I/O, no plotting, no global state.

- Revisited Oxford / Paris: AP as the revisitop ``compute_ap`` (junk removed from the ranking, then
  trapezoids between consecutive recall points), protocols Easy / Medium / Hard, queries without
  positives skipped, mAP in [0, 1].
- Recall@k and mAP@R: leave-one-out over one set, cosine similarity.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from vitscope.errors import VitscopeValueError
from vitscope.functional.knn_search import knn_search

__all__ = [
    "average_precision_revisited",
    "recall_at_k_map_at_r",
    "revisited_aps",
    "revisited_map",
]

PROTOCOLS = ("easy", "medium", "hard")


def average_precision_revisited(
    ranks_of_positives: Sequence[int] | np.ndarray | torch.Tensor, num_positives: int
) -> float:
    """Average precision from the ranks of the retrieved positives, as revisitop's ``compute_ap``.

    For the j-th positive (0-based) at 0-based rank r (junk already removed from the ranking):
    ``precision_0 = 1 if r == 0 else j / r``, ``precision_1 = (j + 1) / (r + 1)``, and
    ``ap += (precision_0 + precision_1) * (1 / num_positives) / 2``. Positives never retrieved simply
    contribute nothing.

    Args:
        ranks_of_positives: ``[m]`` 0-based ranks of the positives in the junk-free ranking, ascending.
        num_positives: number of positives of the query (``nres``; >= m).

    Returns:
        AP in [0, 1].
    """
    ranks = np.asarray(
        ranks_of_positives.detach().cpu().numpy()
        if isinstance(ranks_of_positives, torch.Tensor)
        else ranks_of_positives
    ).reshape(-1)
    if num_positives < 1:
        raise VitscopeValueError(f"num_positives must be >= 1, got {num_positives}")
    if ranks.size > num_positives:
        raise VitscopeValueError(f"{ranks.size} positive ranks given for num_positives={num_positives}")
    recall_step = 1.0 / num_positives
    ap = 0.0
    for j, rank in enumerate(ranks.tolist()):
        precision_0 = 1.0 if rank == 0 else j / rank
        precision_1 = (j + 1) / (rank + 1)
        ap += (precision_0 + precision_1) * recall_step / 2.0
    return float(ap)


def _field(entry: object, key: str) -> np.ndarray:
    if isinstance(entry, Mapping):
        value = entry.get(key, ())
    else:
        value = getattr(entry, key, ())
    if value is None:
        value = ()
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    return np.asarray(value, dtype=np.int64).reshape(-1)


def _has(entry: object, key: str) -> bool:
    return key in entry if isinstance(entry, Mapping) else hasattr(entry, key)


def _protocol_sets(entry: object, protocol: str | None) -> tuple[np.ndarray, np.ndarray]:
    """(positives, junk) of one query under the revisited protocol."""
    if protocol is None:
        if not _has(entry, "ok"):
            raise VitscopeValueError("protocol=None needs ground truth already resolved as "
                                     "{'ok': [...], 'junk': [...]}")
        return _field(entry, "ok"), _field(entry, "junk")
    easy, hard, junk = _field(entry, "easy"), _field(entry, "hard"), _field(entry, "junk")
    if protocol == "easy":
        return easy, np.concatenate([junk, hard])
    if protocol == "medium":
        return np.concatenate([easy, hard]), junk
    return hard, np.concatenate([junk, easy])


def revisited_aps(
    similarity: torch.Tensor | np.ndarray, gnd: Sequence[object], protocol: str | None = "medium"
) -> torch.Tensor:
    """Per-query AP under the revisited protocol (NaN for queries without positives).

    The database is ranked by descending similarity (a stable sort: equal similarities keep the
    database order). Junk images are removed from the ranking: each positive's rank drops by the number
    of junk images ranked strictly before it, exactly as revisitop's ``compute_map``.

    Args:
        similarity: ``[Q, D]`` query-to-database similarity (cosine for vitscope).
        gnd: Q ground-truth entries, dicts or objects with ``easy``, ``hard``, ``junk`` index lists into
            the database (e.g. ``RetrievalGroundTruth``). With ``protocol=None`` each entry must already
            hold ``ok`` and ``junk`` (as ``RevisitOPDataset.protocol(level)`` returns).
        protocol: ``"easy"`` (positives easy; junk = junk + hard), ``"medium"`` (positives easy + hard;
            junk = junk), ``"hard"`` (positives hard; junk = junk + easy), or None (see ``gnd``).

    Returns:
        ``[Q]`` float64 AP per query, NaN where the query has no positive.
    """
    if protocol is not None:
        protocol = protocol.lower()
        if protocol not in PROTOCOLS:
            raise VitscopeValueError(f"protocol must be one of {PROTOCOLS} or None, got {protocol!r}")
    sim = similarity.detach().cpu() if isinstance(similarity, torch.Tensor) else torch.as_tensor(np.asarray(similarity))
    if sim.dim() != 2:
        raise VitscopeValueError(f"similarity must be [Q, D], got shape {tuple(sim.shape)}")
    num_q, num_db = sim.shape
    if len(gnd) != num_q:
        raise VitscopeValueError(f"gnd has {len(gnd)} entries for {num_q} queries (rows of similarity)")
    order = torch.argsort(-sim.to(torch.float64), dim=1, stable=True).numpy()  # [Q, D] database ids by rank
    aps = np.full(num_q, np.nan)
    for q in range(num_q):
        positives, junk = _protocol_sets(gnd[q], protocol)
        if positives.size == 0:
            continue
        if positives.min() < 0 or positives.max() >= num_db:
            raise VitscopeValueError(f"query {q}: positive indices outside the database [0, {num_db})")
        pos_ranks = np.flatnonzero(np.isin(order[q], positives))
        junk_ranks = np.flatnonzero(np.isin(order[q], junk))
        pos_ranks = pos_ranks - np.searchsorted(junk_ranks, pos_ranks, side="left")
        aps[q] = average_precision_revisited(pos_ranks, positives.size)
    return torch.from_numpy(aps)


def revisited_map(
    similarity: torch.Tensor | np.ndarray, gnd: Sequence[object], protocol: str | None = "medium"
) -> float:
    """Mean AP under the revisited Oxford / Paris protocol (see :func:`revisited_aps`).

    Args:
        similarity: ``[Q, D]`` query-to-database similarity.
        gnd: Q ground-truth entries with ``easy``, ``hard``, ``junk`` (dicts or objects).
        protocol: ``"easy"``, ``"medium"`` or ``"hard"`` (or None for pre-resolved ``ok``/``junk``).

    Returns:
        mAP in [0, 1] over the queries that have positives; NaN if none has.
    """
    aps = revisited_aps(similarity, gnd, protocol)
    valid = aps[~torch.isnan(aps)]
    return float(valid.mean()) if valid.numel() else math.nan


def recall_at_k_map_at_r(
    embeddings: torch.Tensor,
    labels: torch.Tensor | np.ndarray,
    ks: Sequence[int] = (1, 2, 4, 8),
    chunk_size: int = 1024,
) -> dict[str, float]:
    """Leave-one-out Recall@k and mAP@R over one set (docs/methods.md, Probes per block, paper 000 section 5).

    Every item queries all the others by cosine similarity; it never retrieves itself. Queries whose
    label has no other item are skipped for every metric. Recall@k of a query = 1 if any of its k
    nearest others shares its label (k is clamped to n - 1). With R = number of other items sharing the
    query's label, ``mAP@R = mean over queries of (1/R) sum_{i<=R} P(i) rel(i)``. Neighbours come from
    :func:`~vitscope.functional.knn_search.knn_search`, which scores ``chunk_size`` queries against a tile of the
    set at a time, so memory does not grow with n; of several items tied at the k-th place (identical embeddings),
    which ones enter is ``torch.topk``'s choice, so exact ties can move the scores (by 0.025 in R@1 on 40 identical
    embeddings of two alternating labels), while items apart in similarity never do.

    Args:
        embeddings: ``[n, d]`` embeddings.
        labels: ``[n]`` integer labels.
        ks: the k of Recall@k.
        chunk_size: queries per chunk.

    Returns:
        ``{"R@1": ..., "R@2": ..., ..., "mAP@R": ...}`` as Python floats in [0, 1] (NaN when no query
        qualifies).
    """
    if not isinstance(embeddings, torch.Tensor) or embeddings.dim() != 2:
        shape = tuple(embeddings.shape) if isinstance(embeddings, torch.Tensor) else type(embeddings).__name__
        raise VitscopeValueError(f"embeddings must be a torch.Tensor [n, d], got {shape}")
    lab = labels.detach().cpu() if isinstance(labels, torch.Tensor) else torch.as_tensor(np.asarray(labels))
    lab = lab.reshape(-1)
    if lab.dtype.is_floating_point or lab.dtype == torch.bool or lab.is_complex():
        raise VitscopeValueError(f"labels must be integers, got dtype {lab.dtype}")
    n = embeddings.shape[0]
    if lab.numel() != n:
        raise VitscopeValueError(f"labels has {lab.numel()} entries for {n} embeddings")
    ks = [int(k) for k in ks]
    if any(k < 1 for k in ks):
        raise VitscopeValueError(f"every k must be >= 1, got {ks}")
    if int(chunk_size) != chunk_size or chunk_size < 1:
        raise VitscopeValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")

    names = [f"R@{k}" for k in ks] + ["mAP@R"]
    emb = embeddings.detach()
    emb = F.normalize(emb.to(torch.float64 if emb.dtype == torch.float64 else torch.float32), dim=1)
    lab = lab.to(device=emb.device, dtype=torch.int64)
    _, inverse, counts = torch.unique(lab, return_inverse=True, return_counts=True)
    num_relevant = counts[inverse] - 1  # R per item
    queries = torch.nonzero(num_relevant > 0).reshape(-1)
    if queries.numel() == 0:
        return dict.fromkeys(names, math.nan)

    hits = torch.zeros(len(ks), dtype=torch.float64)
    ap_sum = 0.0
    for start in range(0, queries.numel(), int(chunk_size)):
        q = queries[start : start + int(chunk_size)]
        r = num_relevant[q]  # [c]
        depth = min(n - 1, max(max(ks), int(r.max())))
        # blocked: chunk_size x bank_tile similarities at a time; a query never retrieves itself
        _, top_idx = knn_search(emb[q], emb, depth, exclude=q, query_tile=int(chunk_size))  # [c, depth]
        rel = (lab[top_idx] == lab[q].unsqueeze(1)).to(torch.float64)  # [c, depth]
        for i, k in enumerate(ks):
            hits[i] += (rel[:, : min(k, depth)].sum(dim=1) > 0).sum().item()
        positions = torch.arange(1, depth + 1, dtype=torch.float64, device=emb.device)
        within_r = positions.unsqueeze(0) <= r.unsqueeze(1).to(torch.float64)  # [c, depth]
        rel_r = rel * within_r
        precision = rel_r.cumsum(dim=1) / positions
        ap_sum += ((precision * rel_r).sum(dim=1) / r.to(torch.float64)).sum().item()

    num_q = queries.numel()
    out = {name: float(hits[i] / num_q) for i, name in enumerate(names[:-1])}
    out["mAP@R"] = ap_sum / num_q
    return out
