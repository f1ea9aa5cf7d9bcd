"""Exact k-nearest-neighbour search, blocked: queries x bank in tiles, the top-k of each tile merged.

Memory is bounded by the tile (``query_tile x bank_tile`` scores), never by ``queries x bank``: 100,000 x
100,000 similarities would be 40 GB, a tile of 2,048 x 32,768 is 256 MB. The bank may live on the CPU while
the search runs on a GPU: tiles are moved as they are needed. Pure tensor functions: no I/O, no global state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vitscope.errors import VitscopeTypeError, VitscopeValueError
from vitscope.functional.topk import topk_order

__all__ = ["METRICS", "knn_search"]

METRICS: tuple[str, ...] = ("ip", "cosine", "l2")


def _as_matrix(x: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise VitscopeTypeError(f"{name} must be a torch.Tensor [n, d], got {type(x).__name__}")
    if x.dim() != 2:
        raise VitscopeValueError(f"{name} must be [n, d], got shape {tuple(x.shape)}")
    return x.detach()


def _merge(best: tuple[torch.Tensor, torch.Tensor] | None, scores: torch.Tensor, index: torch.Tensor, k: int
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best of the running best and a tile's candidates: score descending, then index ascending."""
    if best is not None:
        scores, index = torch.cat([best[0], scores], dim=1), torch.cat([best[1], index], dim=1)
    order = topk_order(scores, index, k, dim=1)
    return scores.gather(1, order), index.gather(1, order)


def knn_search(
    queries: torch.Tensor,
    bank: torch.Tensor,
    k: int = 10,
    metric: str = "ip",
    exclude_self: bool = False,
    exclude: torch.Tensor | None = None,
    query_tile: int = 2048,
    bank_tile: int = 32768,
    device: str | torch.device | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` bank rows nearest to every query, exactly.

    Scores are inner products (``"ip"``, as ``faiss.IndexFlatIP``), cosine similarities (``"cosine"``: rows
    L2-normalised first) or negated squared L2 distances (``"l2"``: nearest first, as ``faiss.IndexFlatL2``
    but with the sign flipped so that higher is always better), computed in float32 (float64 when both inputs
    are float64). Neighbours are ordered by score, ties by bank position (lower first) across tiles; within
    one tile, which of several rows tied at the k-th place enters the candidates is the one ``torch.topk``
    picks.

    Args:
        queries: ``[Q, d]``.
        bank: ``[N, d]`` (may stay on the CPU when ``device`` is a GPU).
        k: neighbours per query; at most ``N`` (``N - 1`` with ``exclude_self``).
        metric: ``"ip"``, ``"cosine"`` or ``"l2"``.
        exclude_self: queries are the bank's own rows (``Q == N``): row ``i`` is not its own neighbour.
        exclude: ``[Q]`` int64: a bank position each query may not have as a neighbour (e.g. the query's own
            row when the queries are some of the bank's rows; -1 for none).
        query_tile: queries per tile.
        bank_tile: bank rows per tile.
        device: where the tiles are scored (default: the queries' device).

    Returns:
        ``(scores [Q, k], indices [Q, k])``: float scores, best first, and int64 bank positions, on ``device``.
    """
    q, b = _as_matrix(queries, "queries"), _as_matrix(bank, "bank")
    if metric not in METRICS:
        raise VitscopeValueError(f"metric must be one of {METRICS}, got {metric!r}")
    if q.shape[1] != b.shape[1]:
        raise VitscopeValueError(f"feature sizes differ: queries d={q.shape[1]}, bank d={b.shape[1]}")
    if exclude_self and q.shape[0] != b.shape[0]:
        raise VitscopeValueError(f"exclude_self needs the queries to be the bank ({q.shape[0]} queries, {b.shape[0]} "
                                 "rows)")
    dev = torch.device(device) if device is not None else q.device
    if exclude_self:
        exclude = torch.arange(q.shape[0])
    if exclude is not None:
        exclude = torch.as_tensor(exclude, dtype=torch.int64).reshape(-1).to(dev)
        if exclude.numel() != q.shape[0]:
            raise VitscopeValueError(f"exclude has {exclude.numel()} entries for {q.shape[0]} queries")
    available = b.shape[0] - int(exclude is not None)
    if int(k) != k or k < 1 or k > available:
        raise VitscopeValueError(f"k must be an integer in [1, {available}] for a bank of {b.shape[0]} rows, got {k!r}")
    for name, value in (("query_tile", query_tile), ("bank_tile", bank_tile)):
        if int(value) != value or value < 1:
            raise VitscopeValueError(f"{name} must be a positive integer, got {value!r}")
    dtype = torch.float64 if q.dtype == b.dtype == torch.float64 else torch.float32
    k = int(k)
    out_scores, out_index = [], []
    for qs in range(0, q.shape[0], int(query_tile)):
        qt = _prepare(q[qs:qs + int(query_tile)], metric, dtype, dev)
        best = None
        for bs in range(0, b.shape[0], int(bank_tile)):
            bt = _prepare(b[bs:bs + int(bank_tile)], metric, dtype, dev)
            scores = qt @ bt.T  # [tq, tb]
            if metric == "l2":  # -(|q|^2 - 2 q.b + |b|^2); |q|^2 does not change the order but keeps faiss's values
                scores.mul_(2).sub_(bt.square().sum(dim=1)).sub_(qt.square().sum(dim=1, keepdim=True))
            if exclude is not None:
                rows = torch.arange(qt.shape[0], device=dev)
                cols = exclude[qs:qs + int(query_tile)] - bs
                inside = (cols >= 0) & (cols < bt.shape[0])
                scores[rows[inside], cols[inside]] = -torch.inf
            top = scores.topk(min(k, scores.shape[1]), dim=1)
            best = _merge(best, top.values, top.indices + bs, k)
        assert best is not None
        out_scores.append(best[0])
        out_index.append(best[1])
    if not out_scores:
        return torch.zeros(0, k, dtype=dtype, device=dev), torch.zeros(0, k, dtype=torch.int64, device=dev)
    return torch.cat(out_scores), torch.cat(out_index)


def _prepare(x: torch.Tensor, metric: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    x = x.to(device=device, dtype=dtype)
    return F.normalize(x, dim=1) if metric == "cosine" else x
