"""SigLIP vision tower: no prefix token; the classifier pools every token."""

from __future__ import annotations

from typing import Any

from vitscope.models.entry import ModelEntry
from vitscope.models.families._common import INCEPTION, mean_token_head
from vitscope.models.family import HFFamily, load_auto, register_family
from vitscope.models.hf_pretrained import from_pretrained


def _load(source: str, config: Any, **hub: Any):
    """A full SigLIP checkpoint loads its vision tower only; a vision-only one loads as its config says."""
    import transformers as tf

    if config.model_type == "siglip":
        return from_pretrained(tf.SiglipVisionModel, source, **hub)
    return load_auto(source, config, **hub)


FAMILY = register_family(HFFamily(
    name="siglip",
    preprocessing={"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "interpolation": "bicubic"},
    prefix=lambda config: (),
    load=_load,
    head=mean_token_head,
    aliases=(
        ModelEntry("siglip-b16", "siglip", 12, 12, 768, 16, (), "google/siglip-base-patch16-224",
                   {**INCEPTION, "interpolation": "bicubic"}),
        # SigLIP 2 at a fixed resolution is SigLIP's architecture (its NaFlex variant is a family of its own);
        # preprocessing: the checkpoint's own preprocessor_config.json
        ModelEntry("siglip2-b16-224", "siglip", 12, 12, 768, 16, (), "google/siglip2-base-patch16-224"),
        ModelEntry("siglip2-b16-256", "siglip", 12, 12, 768, 16, (), "google/siglip2-base-patch16-256"),
    ),
))
