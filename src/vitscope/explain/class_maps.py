"""Class similarity maps (paper 000 section 4.2, figure 5).

A query's class similarity map is the sum of its paired maps against every other gallery image of its
class: the regions of the query that its whole class agrees on.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from vitscope.explain.paired import Encoded, PairedSimilarity

__all__ = ["class_similarity_maps"]


def class_similarity_maps(
    explainer: PairedSimilarity, gallery: Encoded, labels: torch.Tensor | np.ndarray,
    queries: Sequence[int] | torch.Tensor, raw: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of each query's maps against the other gallery images of its class (no forward pass).

    Args:
        explainer: the :class:`PairedSimilarity` that encoded the gallery.
        gallery: ``G`` encoded images.
        labels: ``[G]`` class labels.
        queries: gallery indices of the queries.
        raw: sum the raw token contributions instead of the redistributed maps.

    Returns:
        ``maps [Q, h, w]`` and ``counts [Q]`` (number of maps summed; a query alone in its class gets a
        zero map and count 0; no queries: ``[0, h, w]`` and ``[0]``).
    """
    labels = torch.as_tensor(labels).long().cpu()
    q = torch.as_tensor(queries, dtype=torch.long).reshape(-1)
    empty = torch.zeros(0, dtype=torch.long)
    pair_q, pair_g = [empty], [empty]  # no queries: no pairs
    for i, qi in enumerate(q.tolist()):
        same = torch.nonzero(labels == labels[qi]).flatten()
        same = same[same != qi]
        pair_q.append(torch.full((len(same),), i, dtype=torch.long))
        pair_g.append(same)
    owner, gal = torch.cat(pair_q), torch.cat(pair_g)
    maps = torch.zeros(len(q), *gallery.grid)
    if len(gal):
        out = explainer.explain_indices(gallery, q[owner], gallery, gal)
        maps = maps.to(out.map_a.dtype).index_add_(0, owner, out.raw_a if raw else out.map_a)
    return maps, torch.bincount(owner, minlength=len(q))
