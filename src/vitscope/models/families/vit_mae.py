"""ViT-MAE: run with nothing masked and a fixed increasing noise, so the patches keep their order."""

from __future__ import annotations

import inspect
from typing import Any

import torch

from vitscope.models.entry import ModelEntry
from vitscope.models.families._common import DINO
from vitscope.models.family import HFFamily, register_family
from vitscope.models.hf_pretrained import from_pretrained


def _load(source: str, config: Any, **hub: Any):
    import transformers as tf

    return from_pretrained(tf.ViTMAEModel, source, config=config, **hub)


def _prepare(model: Any) -> None:
    """Nothing masked: transformers' default ``mask_ratio`` 0.75 would drop three patches in four, at random, from
    every forward (the forward also fixes the patch order). The embeddings read the ratio from their config."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "mask_ratio"):
            config.mask_ratio = 0.0


def _forward_kwargs(backbone: Any, fn: Any, pixels: torch.Tensor) -> dict[str, Any]:
    if "noise" not in inspect.signature(fn).parameters:
        return {}
    h, w = backbone.spec.grid_for(*pixels.shape[-2:])
    return {"noise": torch.arange(h * w, device=pixels.device, dtype=torch.float32).expand(pixels.shape[0], -1)}


FAMILY = register_family(HFFamily(
    name="vit_mae",
    load=_load,
    prepare=_prepare,
    forward_kwargs=_forward_kwargs,
    aliases=(
        ModelEntry("mae-vitb16", "vit_mae", 12, 12, 768, 16, ("cls",), "facebook/vit-mae-base", DINO),
        ModelEntry("mae-vitl16", "vit_mae", 24, 16, 1024, 16, ("cls",), "facebook/vit-mae-large", DINO),
    ),
))
