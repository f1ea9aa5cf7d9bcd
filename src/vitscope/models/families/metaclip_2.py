"""MetaCLIP 2: CLIP's descriptor (CLS token, the classifier pooling the patch tokens before the final norm, which
normalises the pooled CLS only), with its own loading: its vision tower is not reachable through ``AutoModel``."""

from __future__ import annotations

import dataclasses
from typing import Any

from vitscope.models.entry import ModelEntry
from vitscope.models.families import clip
from vitscope.models.families._common import vision_config_of
from vitscope.models.family import load_auto, register_family
from vitscope.models.hf_pretrained import from_pretrained


def _load(source: str, config: Any, **hub: Any):
    """A classifier loads as its class; a whole image-text checkpoint loads its vision tower; a vision-only one
    loads as its config's architecture says (``AutoModel`` does not know MetaCLIP 2's vision configs)."""
    import transformers as tf

    archs = config.architectures or []
    if any(a.endswith("ForImageClassification") for a in archs):
        return load_auto(source, config, **hub)
    if config.model_type == "metaclip_2":
        return from_pretrained(tf.MetaClip2VisionModelWithProjection, source, config=vision_config_of(config), **hub)
    vision = next((getattr(tf, a) for a in archs if a.startswith("MetaClip2Vision") and hasattr(tf, a)),
                  tf.MetaClip2VisionModel)
    return from_pretrained(vision, source, **hub)


FAMILY = register_family(dataclasses.replace(
    clip.FAMILY,
    name="metaclip_2",
    load=_load,
    aliases=(  # preprocessing: the checkpoint's own preprocessor_config.json
        ModelEntry("metaclip2-b16", "metaclip_2", 12, 12, 768, 16, ("cls",), "facebook/metaclip-2-worldwide-b16"),
        ModelEntry("metaclip2-l14", "metaclip_2", 24, 16, 1024, 14, ("cls",), "facebook/metaclip-2-worldwide-l14"),
    ),
))
