"""DeiT: CLS and distillation tokens; the distilled classifier averages its two heads."""

from __future__ import annotations

from typing import Any

import torch

from vitscope.models.entry import ModelEntry
from vitscope.models.families._common import DINO
from vitscope.models.family import HFFamily, register_family


def _head(backbone: Any, tokens: torch.Tensor) -> torch.Tensor:
    m = backbone.model
    if hasattr(m, "cls_classifier"):  # DeiTForImageClassificationWithTeacher
        return (m.cls_classifier(tokens[:, 0]) + m.distillation_classifier(tokens[:, 1])) / 2
    return m.classifier(tokens[:, 0])


FAMILY = register_family(HFFamily(
    name="deit",
    prefix=lambda config: ("cls", "dist"),
    head=_head,
    aliases=(
        ModelEntry("deit-s16", "deit", 12, 6, 384, 16, ("cls", "dist"), "facebook/deit-small-distilled-patch16-224",
                   DINO),
        ModelEntry("deit-b16", "deit", 12, 12, 768, 16, ("cls", "dist"), "facebook/deit-base-distilled-patch16-224",
                   DINO),
    ),
))
