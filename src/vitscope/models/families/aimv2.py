"""AIMv2 vision encoder: no prefix token, RMSNorm, a gated (SwiGLU) MLP whose ``mlp.post`` is the input of its down
projection. A full image-text checkpoint (``Aimv2Model``) loads its vision tower: loading it straight into
``Aimv2VisionModel`` would leave every weight random."""

from __future__ import annotations

from typing import Any

from vitscope.models.entry import ModelEntry
from vitscope.models.families._common import CLIP
from vitscope.models.family import HFFamily, load_auto, register_family
from vitscope.models.hf_pretrained import from_pretrained
from vitscope.models.layout_names import HFLayout


def _load(source: str, config: Any, **hub: Any):
    import transformers as tf

    if config.model_type == "aimv2":  # image and text: the vision tower of the whole model
        return from_pretrained(tf.Aimv2Model, source, **hub).vision_model
    return load_auto(source, config, **hub)


def _native(config: Any) -> bool:
    """The ``native`` checkpoints build sine-cosine positions for any grid; the others have one learned table."""
    return bool(getattr(getattr(config, "vision_config", config), "is_native", False))


FAMILY = register_family(HFFamily(
    name="aimv2",
    preprocessing={k: CLIP[k] for k in ("mean", "std", "interpolation")},
    prefix=lambda config: (),
    load=_load,
    resizable=_native,
    layout=HFLayout(norm1=("rms_norm1",), norm2=("rms_norm2",), mlp=("ffn",), mlp_out=("down_proj",),
                    final_norm=("rms_norm",)),
    aliases=(  # preprocessing: the checkpoint's own preprocessor_config.json
        ModelEntry("aimv2-large-patch14-224", "aimv2", 24, 8, 1024, 14, (), "apple/aimv2-large-patch14-224"),
        ModelEntry("aimv2-large-patch14-native", "aimv2", 24, 8, 1024, 14, (), "apple/aimv2-large-patch14-native"),
    ),
))
