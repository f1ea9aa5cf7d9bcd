"""DINOv2: CLS token; the classifier reads the CLS token concatenated with the mean of the patch tokens."""

from __future__ import annotations

from typing import Any

import torch

from vitscope.models.entry import ModelEntry
from vitscope.models.families._common import DINO
from vitscope.models.family import HFFamily, register_family


def cls_and_patch_mean_head(backbone: Any, tokens: torch.Tensor) -> torch.Tensor:
    p = backbone.spec.num_prefix_tokens
    return backbone.model.classifier(torch.cat([tokens[:, 0], tokens[:, p:].mean(dim=1)], dim=1))


FAMILY = register_family(HFFamily(
    name="dinov2",
    head=cls_and_patch_mean_head,
    aliases=(
        ModelEntry("dinov2-vits14", "dinov2", 12, 6, 384, 14, ("cls",), "facebook/dinov2-small", DINO),
        ModelEntry("dinov2-vitb14", "dinov2", 12, 12, 768, 14, ("cls",), "facebook/dinov2-base", DINO),
    ),
))
