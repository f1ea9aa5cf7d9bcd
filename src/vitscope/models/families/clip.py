"""CLIP vision tower: CLS token; the classifier pools the patch tokens before the final norm."""

from __future__ import annotations

from typing import Any

import torch

from vitscope.models.entry import ModelEntry
from vitscope.models.families._common import CLIP, vision_config_of
from vitscope.models.family import HFFamily, load_auto, register_family
from vitscope.models.hf_pretrained import from_pretrained
from vitscope.models.layout_names import HFLayout


def _load(source: str, config: Any, **hub: Any):
    """A full CLIP checkpoint loads its vision tower only; a vision-only one loads as its config says."""
    import transformers as tf

    if config.model_type == "clip":
        return from_pretrained(tf.CLIPVisionModelWithProjection, source, config=vision_config_of(config), **hub)
    return load_auto(source, config, **hub)


def _head(backbone: Any, tokens: torch.Tensor) -> torch.Tensor:
    return backbone.model.classifier(tokens[:, backbone.spec.num_prefix_tokens:].mean(dim=1))


FAMILY = register_family(HFFamily(
    name="clip",
    preprocessing={k: CLIP[k] for k in ("mean", "std", "interpolation")},
    load=_load,
    head=_head,
    head_after_final_norm=False,
    layout=HFLayout(final_norm_on_sequence=False),  # post_layernorm normalises the pooled CLS only
    aliases=(
        ModelEntry("clip-vitb16", "clip", 12, 12, 768, 16, ("cls",), "openai/clip-vit-base-patch16", CLIP),
        ModelEntry("clip-vitb32", "clip", 12, 12, 768, 32, ("cls",), "openai/clip-vit-base-patch32", CLIP),
    ),
))
