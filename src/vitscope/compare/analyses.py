"""The analyses one comparison pass runs on a model: pooled features, plus attention where there is some."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from vitscope.analyses.attention.base import has_cls_token
from vitscope.analyses.attention.geometry import AttentionDistance
from vitscope.analyses.attention.maps import CLSAttentionMaps, SpatialAverageMaps
from vitscope.analyses.attention.saliency import SaliencyIoU
from vitscope.analyses.base import Analysis
from vitscope.analyses.registry import why_skipped
from vitscope.compare.pooled import PooledFeatures
from vitscope.models.spec import ModelSpec

__all__ = ["compare_analyses", "compare_not_run"]


def compare_analyses(spec: ModelSpec, targets: Collection[str], images: Sequence[int] = (0, 1, 2, 3),
                     seed: int = 0) -> list[Analysis]:
    """Analysiss for one model's single pass of ``vitscope compare``.

    Every model: :class:`PooledFeatures` (clustering, k-NN, CKA between models). Transformers also get the
    attention distance, saliency IoU (when the data has masks) and the CLS (or spatial-average) maps of the
    dataset and of ``images`` for the report's explorer (they share one reduction per block and batch).
    """
    chosen: list[Analysis] = [PooledFeatures()]
    if spec.is_transformer:
        maps = CLSAttentionMaps if has_cls_token(spec) else SpatialAverageMaps
        chosen += [AttentionDistance(seed=seed), maps(images=images, seed=seed)]
        if "masks" in targets:
            chosen.append(SaliencyIoU(seed=seed))
        chosen = [a for a in chosen if a.supports(spec)]
    return chosen


def compare_not_run(spec: ModelSpec, targets: Collection[str]) -> dict[str, str]:
    """The attention measurements of a comparison that ``spec`` or the data cannot give: name -> reason (a CNN has
    no attention; saliency IoU needs masks)."""
    maps = CLSAttentionMaps if has_cls_token(spec) else SpatialAverageMaps
    wanted = [AttentionDistance(), maps(), SaliencyIoU()]
    reasons = {a.name: why_skipped(a, spec, frozenset(targets)) for a in wanted}
    return {name: reason for name, reason in reasons.items() if reason is not None}
