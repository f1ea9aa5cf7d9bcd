"""Retrieval with explanations (paper 000 section 5.1, figure 9, table 2).

The gallery is encoded once (:meth:`PairedSimilarity.encode`); every query is answered from the cached
embeddings and explained against its top-k from the cached parts and rollout matrices, so explaining
costs no forward pass beyond the one per gallery image.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from vitscope.errors import VitscopeValueError
from vitscope.explain.paired import Encoded, PairedSimilarity
from vitscope.functional.similarity import cosine_topk, retrieval_metrics
from vitscope.models.spec import ModelSpec
from vitscope.train.data import TensorImages

__all__ = ["RetrievalExplanation", "explain_retrieval", "sop_tensors"]


@dataclass
class RetrievalExplanation:
    """Top-k retrieval results of some queries with their maps.

    Attributes:
        queries: ``[Q]`` gallery index of each query.
        indices: ``[Q, k]`` gallery indices of the retrieved images, most similar first.
        scores: ``[Q, k]`` cosine similarities.
        correct: ``[Q, k]`` bool, retrieved label equals the query's.
        query_maps: ``[Q, k, h, w]`` the query's map against each retrieved image.
        gallery_maps: ``[Q, k, h, w]`` each retrieved image's map against the query.
        query_rollout: ``[Q, h, w]`` the query's output-agnostic rollout map, or None.
        metrics: Recall@k and mAP@R of the whole gallery, leave-one-out (paper 000 table 2).
    """

    queries: torch.Tensor
    indices: torch.Tensor
    scores: torch.Tensor
    correct: torch.Tensor
    query_maps: torch.Tensor
    gallery_maps: torch.Tensor
    query_rollout: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)


def explain_retrieval(
    explainer: PairedSimilarity, gallery: Encoded, labels: torch.Tensor | np.ndarray, k: int = 4,
    queries: Sequence[int] | torch.Tensor | None = None, ks: Sequence[int] = (1, 2, 4, 8), chunk: int = 1024,
) -> RetrievalExplanation:
    """Leave-one-out retrieval over an encoded gallery, with the maps of every query against its top-k.

    Args:
        explainer: the :class:`PairedSimilarity` that encoded the gallery.
        gallery: ``G`` encoded images.
        labels: ``[G]`` class labels (a retrieval is correct when labels match).
        k: retrieved images per query.
        queries: gallery indices used as queries (default: all; none: every per-query field has ``Q = 0``).
        ks: the k of the Recall@k reported in ``metrics``.
        chunk: pairs explained per batch (bounds memory; no forward pass either way).

    Returns:
        :class:`RetrievalExplanation`.
    """
    labels = torch.as_tensor(labels).long().cpu()
    if len(labels) != len(gallery):
        raise VitscopeValueError(f"{len(gallery)} gallery images but {len(labels)} labels")
    q = torch.arange(len(gallery)) if queries is None else torch.as_tensor(queries, dtype=torch.long).reshape(-1)
    emb = gallery.embeddings
    scores, indices = cosine_topk(emb[q], emb, k, exclude=q)
    flat_q, flat_g = q.repeat_interleave(k), indices.flatten()
    qmaps, gmaps = [], []
    for s in range(0, len(flat_q), chunk):
        out = explainer.explain_indices(gallery, flat_q[s:s + chunk], gallery, flat_g[s:s + chunk])
        qmaps.append(out.map_a)
        gmaps.append(out.map_b)
    grid = gallery.grid

    def stacked(maps: list[torch.Tensor]) -> torch.Tensor:  # [Q, k, h, w], also for no queries
        return (torch.cat(maps) if maps else torch.zeros(0, *grid)).reshape(len(q), k, *grid)

    ks = tuple(x for x in ks if x < len(gallery)) or (1,)
    return RetrievalExplanation(
        queries=q, indices=indices, scores=scores, correct=labels[indices] == labels[q].unsqueeze(1),
        query_maps=stacked(qmaps), gallery_maps=stacked(gmaps),
        query_rollout=None if gallery.agnostic is None else gallery.agnostic[q].reshape(len(q), *grid),
        metrics=retrieval_metrics(emb, labels, ks=ks))


def sop_tensors(root: str | os.PathLike, spec: ModelSpec, split: str = "test",
                limit: int | None = None) -> TensorImages:
    """Read an SOP-format dataset (``Ebay_<split>.txt``) into uint8 images at the model's input size.

    Labels are the products (SOP classes); ``instances`` holds the same ids.
    """
    from vitscope.data.formats.sop import SOPDataset
    from vitscope.data.images import load_rgb
    from vitscope.models.preprocess import resize_crop

    ds = SOPDataset(root, split)
    n = len(ds) if limit is None else min(limit, len(ds))
    if n == 0:
        raise VitscopeValueError(f"{ds!r} has no images")
    items = [ds[i] for i in range(n)]
    arrays = [np.asarray(resize_crop(load_rgb(it.image_path), spec), dtype=np.uint8) for it in items]
    images = torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()
    labels = torch.tensor([it.label for it in items], dtype=torch.int64)
    return TensorImages(images, labels, labels.clone(), ())
