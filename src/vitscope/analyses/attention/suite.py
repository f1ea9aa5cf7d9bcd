"""The attention suite of paper 002 (section 4, appendix C) plus rollout and entropy, as one group.

``attention_suite(spec, targets)`` builds every attention analysis that can run on the model and data, with
shared options (random baseline, chosen images). They read the per-block statistics as a shared quantity of
the batch, so every block's pattern is reduced once per batch for all of them
(:mod:`vitscope.functional.attention_blocks`). ``vitscope analyze --analyses attention`` runs the same group
(members registered with ``groups=("attention",)``) with default options.

Example::

    import vitscope
    from vitscope.analyses.attention.suite import attention_suite
    from vitscope.data.open import as_source

    backbone = vitscope.load_model("tiny-vit")
    data = as_source("synth_coco::coco")  # written by `vitscope synth --format coco --out synth_coco`
    results = vitscope.run(backbone, data, attention_suite(backbone.spec, targets={"masks"}))
    results["saliency_iou"]["cls_best_iou"]   # [L] best-head IoU per block
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from vitscope.analyses.base import Analysis
from vitscope.analyses.data_checks import DataFacts
from vitscope.analyses.params import parameters_of
from vitscope.analyses.registry import ANALYSES, GROUPS, obstacle
from vitscope.errors import VitscopeValueError
from vitscope.models.spec import ModelSpec

__all__ = ["ATTENTION_GROUP", "NoAttentionError", "attention_suite"]

#: the registry group whose members the suite builds (``register_analysis(..., groups=("attention",))``)
ATTENTION_GROUP = "attention"


class NoAttentionError(VitscopeValueError):
    """The model has no attention (a CNN), so no attention analysis can run on it."""


def attention_suite(
    spec: ModelSpec | None = None,
    targets: Collection[str] | None = None,
    images: Sequence[int] = (0, 1, 2, 3),
    seed: int = 0,
    random_samples: int = 4,
    random_kind: str = "uniform",
    mass: float = 0.6,
    best_head: str = "image",
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
) -> list[Analysis]:
    """Every member of the registry's ``attention`` group that can run on ``spec`` and the data, linked to share
    one pass; each member receives the options below that its constructor takes.

    Args:
        spec: the model's ModelSpec (None: assume a ViT with a CLS token).
        targets: ground-truth keys the dataset provides (``batch.targets``); ``saliency_iou`` is included
            only when ``"masks"`` is among them (None counts as none).
        images: dataset indices whose own maps are kept (maps and rollout).
        seed, random_samples, random_kind: the random baseline (one per run, seeded).
        mass, best_head: saliency threshold and best-head rule.
        head_fusion, discard_ratio: rollout options.

    Returns:
        Fresh analyses in registration order: ``cls_attention_maps`` (models with a CLS token),
        ``spatial_average_maps``, ``aligned_attention``, ``attention_distance``, ``saliency_iou`` (with masks),
        ``attention_focus``, ``attention_rollout``, and any other member of the group.

    Raises:
        NoAttentionError: ``spec`` is a CNN.
    """
    if spec is not None and not spec.is_transformer:
        raise NoAttentionError(
            f"the attention analyses need attention patterns, but {spec.name} is a CNN and has no attention; "
            "use a transformer or other analyses"
        )
    options = {"images": images, "seed": seed, "random_samples": random_samples, "random_kind": random_kind,
               "mass": mass, "best_head": best_head, "head_fusion": head_fusion, "discard_ratio": discard_ratio}
    data = DataFacts(targets=targets or ())
    suite = []
    for name in GROUPS[ATTENTION_GROUP]:
        cls = ANALYSES[name]
        accepted = parameters_of(cls)
        analysis = cls(**{key: value for key, value in options.items() if key in accepted})
        cannot = obstacle(analysis, spec, data) if spec is not None else analysis.why_unsupported_data(data)
        if not cannot:
            suite.append(analysis)
    return suite
