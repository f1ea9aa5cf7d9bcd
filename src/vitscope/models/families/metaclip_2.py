"""MetaCLIP 2: CLIP's layout (CLS token, the final norm on the pooled CLS only). Its vision tower is not reachable
through ``AutoModel``: it is loaded explicitly."""

from __future__ import annotations

from typing import Any

import torch

from vitscope.models.entry import ModelEntry
from vitscope.models.families._common import CLIP
from vitscope.models.family import HFFamily, load_auto, register_family
from vitscope.models.hf_pretrained import from_pretrained
from vitscope.models.layout_names import HFLayout


def _load(source: str, config: Any, **hub: Any):
    """A classifier loads as its class; a whole image-text checkpoint loads its vision tower; a vision-only one
    loads as its config's architecture says (``AutoModel`` does not know MetaCLIP 2's vision configs)."""
    import transformers as tf

    archs = config.architectures or []
    if any(a.endswith("ForImageClassification") for a in archs):
        return load_auto(source, config, **hub)
    if config.model_type == "metaclip_2":
        return from_pretrained(tf.MetaClip2VisionModelWithProjection, source, **hub)
    vision = next((getattr(tf, a) for a in archs if a.startswith("MetaClip2Vision") and hasattr(tf, a)),
                  tf.MetaClip2VisionModel)
    return from_pretrained(vision, source, **hub)


def _head(backbone: Any, tokens: torch.Tensor) -> torch.Tensor:
    return backbone.model.classifier(tokens[:, 1:].mean(dim=1))


FAMILY = register_family(HFFamily(
    name="metaclip_2",
    preprocessing={k: CLIP[k] for k in ("mean", "std", "interpolation")},
    load=_load,
    head=_head,
    head_after_final_norm=False,
    layout=HFLayout(final_norm_on_sequence=False),  # post_layernorm normalises the pooled CLS only
    aliases=(  # preprocessing: the checkpoint's own preprocessor_config.json
        ModelEntry("metaclip2-b16", "metaclip_2", 12, 12, 768, 16, ("cls",), "facebook/metaclip-2-worldwide-b16"),
        ModelEntry("metaclip2-l14", "metaclip_2", 24, 16, 1024, 14, ("cls",), "facebook/metaclip-2-worldwide-l14"),
    ),
))
