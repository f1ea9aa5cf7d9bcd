"""The ImageNet segmentation benchmark of Chefer et al. 2021 (``gtsegs_ijcv.mat``): each method's map of the
model's predicted class against the object mask, scored by pixel accuracy, mean IoU and mean average precision
as their evaluation computes them (:func:`~vitscope.functional.explanation_scores.segmentation_scores`), at the
model's input geometry."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from PIL import Image

from vitscope.attribution import attribute
from vitscope.data.formats.imagenet_seg import ImagenetSegmentation
from vitscope.errors import VitscopeValueError
from vitscope.explain.benchmark import Row
from vitscope.explain.pair_report import explained_embedding
from vitscope.functional.explanation_scores import segmentation_scores
from vitscope.models.backbone import Backbone
from vitscope.models.outputs import logits_of
from vitscope.occlusion.regions import instance_masks_to_model

__all__ = ["require_classifier", "segmentation_benchmark"]


def require_classifier(backbone: Backbone, name: str) -> None:
    """Refuse a model the benchmark cannot score: it explains a classifier's predicted class.

    Raises:
        VitscopeValueError: a model without a head, or a metric-learning net whose head projects its embedding.
    """
    if explained_embedding(name, backbone) is not None:
        why = "is a metric-learning net (its head projects the embedding; it has no classes)" \
            if backbone.spec.has_head else "has no classifier head"
        raise VitscopeValueError(f"the ImageNet segmentation benchmark explains a classifier's predicted class; "
                                 f"{name} {why}")


def segmentation_benchmark(backbone: Backbone, name: str, data: ImagenetSegmentation, methods: Sequence[str],
                           limit: int | None = None, batch_size: int = 16,
                           say: Callable[[str], None] | None = None) -> list[Row]:
    """Rows ``(model, method, "segmentation", pixel_accuracy | miou | map)`` over the first ``limit`` images.

    Raises:
        VitscopeValueError: a model that is no classifier (the benchmark explains the predicted class): without a
            head, or a metric-learning net whose head projects its embedding.
    """
    require_classifier(backbone, name)
    count = len(data) if limit is None else min(limit, len(data))
    maps: dict[str, list[torch.Tensor]] = {m: [] for m in methods}
    masks: list[torch.Tensor] = []
    for start in range(0, count, batch_size):
        items = [data[i] for i in range(start, min(start + batch_size, count))]
        pixels = backbone.preprocess([Image.fromarray(image) for image, _ in items])
        masks += [instance_masks_to_model(mask[None], backbone.spec)[0] for _, mask in items]
        with torch.no_grad():
            predicted = logits_of(backbone(pixels)).argmax(-1)
        for method in methods:
            if say:
                say(f"{name}: {method}, images {start}-{start + len(items) - 1}")
            m = attribute(backbone, pixels, predicted, method, upsample=True).cpu()
            maps[method].append(m)
    truth = torch.stack(masks)
    rows = []
    for method, parts in maps.items():
        scores = segmentation_scores(torch.cat(parts), truth)
        rows += [Row(name, method, "segmentation", metric, value, {}, f"{count} images of {data.path.name}")
                 for metric, value in scores.items()]
    return rows
