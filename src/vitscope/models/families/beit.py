"""BEiT: relative position bias (per block, or shared) that every block receives with its resolution."""

from __future__ import annotations

from typing import Any

import torch

from vitscope.models.entry import ModelEntry
from vitscope.models.families._common import INCEPTION
from vitscope.models.family import HFFamily, register_family


def _layer_kwargs(backbone: Any, tokens: torch.Tensor) -> dict[str, Any]:
    """What ``BeitModel.forward`` hands each layer: its resolution and the shared relative position bias."""
    spec = backbone.spec
    hw = tuple(spec.image_size) if tokens.shape[1] == spec.num_tokens else tuple(backbone.last_input_hw)
    kw: dict[str, Any] = {"resolution": hw, "interpolate_pos_encoding": hw != backbone.native_image_size}
    shared = getattr(backbone.base, "shared_position_bias", None)
    kw["attention_mask"] = None
    if shared is not None:
        window = (hw[0] // spec.patch_size, hw[1] // spec.patch_size)
        kw["attention_mask"] = shared(window, interpolate_pos_encoding=kw["interpolate_pos_encoding"],
                                      dim_size=tokens.shape[1])
    return kw


def _head(backbone: Any, tokens: torch.Tensor) -> torch.Tensor:
    return backbone.model.classifier(backbone.base.pooler(tokens))


FAMILY = register_family(HFFamily(
    name="beit",
    preprocessing={"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "interpolation": "bicubic"},
    head=_head,
    layer_kwargs=_layer_kwargs,
    aliases=(
        ModelEntry("beit-b16", "beit", 12, 12, 768, 16, ("cls",), "microsoft/beit-base-patch16-224",
                   {**INCEPTION, "interpolation": "bicubic"}),
    ),
))
