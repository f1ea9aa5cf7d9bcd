"""I-JEPA: the ViT layout without a CLS token; its classifier pools the mean of every token."""

from __future__ import annotations

from typing import Any

import torch

from vitscope.models.entry import ModelEntry
from vitscope.models.family import HFFamily, register_family


def _mean_head(backbone: Any, tokens: torch.Tensor) -> torch.Tensor:
    return backbone.model.classifier(tokens.mean(dim=1))


FAMILY = register_family(HFFamily(
    name="ijepa",
    prefix=lambda config: (),
    head=_mean_head,
    aliases=(  # preprocessing: the checkpoint's own preprocessor_config.json
        ModelEntry("ijepa-vith14", "ijepa", 32, 16, 1280, 14, (), "facebook/ijepa_vith14_1k"),
    ),
))
