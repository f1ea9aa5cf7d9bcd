"""Semantic and pose similarity of retrieved images (paper 000 section 5.2, figure 10).

Given any segmentation (a callable on images, or precomputed label maps such as the synthetic world's
ground truth), the pose similarity of a query with each of its top-k retrieved images is the dot product
of their class distributions (:mod:`vitscope.functional.semantic`), averaged per model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from vitscope.data.synthetic.scene import Scene
from vitscope.errors import VitscopeValueError
from vitscope.functional.semantic import class_histograms, pose_similarity

__all__ = ["pose_similarity_at_k", "scene_segmentations"]


def scene_segmentations(scenes: Sequence[Scene], num_classes: int) -> torch.Tensor:
    """Ground-truth label maps of synthetic scenes: ``[N, H, W]`` int64.

    Visible object pixels get their class id; background pixels get ``num_classes + background type``
    (as a scene parser labels "wall" or "floor"), so ``num_classes + num_backgrounds`` classes in all.
    """
    maps = []
    for s in scenes:
        seg = np.full(s.image.shape[:2], num_classes + s.background, dtype=np.int64)
        for obj in s.objects:  # drawn back to front; masks are already the visible parts
            seg[obj.mask] = obj.class_id
        maps.append(seg)
    return torch.from_numpy(np.stack(maps))


def pose_similarity_at_k(
    indices: torch.Tensor, queries: torch.Tensor, segmentation: torch.Tensor | Callable[[torch.Tensor], torch.Tensor],
    num_classes: int, images: torch.Tensor | None = None, normalize: str = "l1",
) -> dict[str, object]:
    """Pose similarity between each query and its retrieved images.

    Args:
        indices: ``[Q, k]`` retrieved gallery indices (e.g. ``RetrievalExplanation.indices``).
        queries: ``[Q]`` gallery index of each query.
        segmentation: ``[G, H, W]`` label maps of the gallery, or a callable mapping ``images [n, 3, H, W]``
            to ``[n, H, W]`` label maps (then ``images`` is required; only the images used are segmented).
        num_classes: number of segmentation classes.
        images: ``[G, 3, H, W]`` gallery images, for a callable segmentation.
        normalize: class distributions as pixel fractions (``"l1"``, the paper) or unit vectors (``"l2"``).

    Returns:
        ``{"mean": float, "per_rank": [k] floats, "per_query": [Q, k] tensor}``.
    """
    used = torch.unique(torch.cat([queries.flatten(), indices.flatten()]))
    if callable(segmentation):
        if images is None:
            raise VitscopeValueError("a segmentation callable needs the gallery images")
        seg = torch.as_tensor(segmentation(images[used]))
    else:
        seg = torch.as_tensor(segmentation)[used]
    hist = torch.zeros(int(used.max()) + 1, num_classes)
    hist[used] = class_histograms(seg, num_classes, normalize)
    per_query = pose_similarity(hist[queries], hist[indices])
    return {"mean": float(per_query.mean()), "per_rank": per_query.mean(0).tolist(), "per_query": per_query}
