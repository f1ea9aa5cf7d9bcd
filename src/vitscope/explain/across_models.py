"""The same images explained by several models (paper 000 figures 6 and 7).

Figure 6: a query and its top matches at successive training checkpoints of one model
(``vitscope.zoo.checkpoints(name)``: ``@step0`` ... final). Figure 7: fixed pairs explained by models
that differ only in patch size (``tiny-vit-metric`` and ``tiny-vit-metric-p16``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from vitscope.explain.explained_retrieval import RetrievalExplanation, explain_retrieval
from vitscope.explain.paired import PairedSimilarity, PairExplanation
from vitscope.models.backbone import Backbone

__all__ = ["explain_pairs_across_models", "retrieve_across_models"]

ExplainerFactory = Callable[[Backbone], PairedSimilarity]


def _explainers(models: Sequence[str | Backbone], make: ExplainerFactory | None) -> dict[str, PairedSimilarity]:
    from vitscope.models.load import load_model

    out = {}
    for m in models:
        backbone = load_model(m) if isinstance(m, str) else m
        out[m if isinstance(m, str) else backbone.spec.name] = (make or _default)(backbone)
    return out


def _default(backbone: Backbone) -> PairedSimilarity:
    head = getattr(backbone.model, "head", None) or getattr(backbone.model, "fc", None)
    return PairedSimilarity(backbone, projection="head" if isinstance(head, torch.nn.Linear) else None)


def explain_pairs_across_models(
    models: Sequence[str | Backbone], images_a: Any, images_b: Any, make: ExplainerFactory | None = None,
) -> dict[str, PairExplanation]:
    """Explain the pairs ``(images_a[i], images_b[i])`` with every model (figure 7).

    Args:
        models: model names (``load_model``) or Backbones.
        images_a, images_b: uint8 ``[B, 3, H, W]`` images (normalised per model) or PIL lists.
        make: builds each model's explainer (default: mean pooling, the linear head as projection).

    Returns:
        ``{model: PairExplanation}``.
    """
    return {name: ps.explain(images_a, images_b) for name, ps in _explainers(models, make).items()}


def retrieve_across_models(
    models: Sequence[str | Backbone], images: Any, labels: torch.Tensor, queries: Sequence[int], k: int = 3,
    make: ExplainerFactory | None = None,
) -> dict[str, RetrievalExplanation]:
    """Each model's top-k for the same queries over the same gallery, with maps (figures 6 and 9).

    Args:
        models: model names or Backbones (e.g. ``vitscope.zoo.checkpoints("tiny-vit-metric")``).
        images: the gallery (uint8 ``[G, 3, H, W]`` or PIL list), encoded once per model.
        labels: ``[G]`` labels.
        queries: gallery indices of the queries.
        k: retrieved images per query.
        make: see :func:`explain_pairs_across_models`.

    Returns:
        ``{model: RetrievalExplanation}``.
    """
    out = {}
    for name, ps in _explainers(models, make).items():
        out[name] = explain_retrieval(ps, ps.encode(images), labels, k=k, queries=queries)
    return out
