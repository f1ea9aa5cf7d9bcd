"""DINOv3 (ViT): CLS token and registers; 2-D rotary position embeddings on the queries and keys of the patch
tokens, computed from the input's token grid.

The blocks receive the rotations as an argument (``position_embeddings``): :meth:`layer_kwargs` rebuilds them for
the grid of the last input embedded (``backbone.last_input_hw``), so staged execution at any input size equals
the model's forward. The recorded ``attn.q`` / ``attn.k`` are the rotated ones, as the attention kernel multiplies
them.
"""

from __future__ import annotations

from typing import Any

import torch

from vitscope.models.entry import ModelEntry
from vitscope.models.family import HFFamily, register_family
from vitscope.models.layout_names import HFLayout


def _prefix(config: Any) -> tuple[str, ...]:
    return ("cls",) + ("reg",) * int(getattr(config, "num_register_tokens", 0) or 0)


def _rotary(backbone: Any, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> dict[str, Any]:
    """The blocks' arguments: the rotations of the last embedded input's grid (only its shape and device are read),
    or, for a sequence of kept spatial tokens, each token's own rotation (``positions [B, K]``)."""
    h, w = backbone.last_input_hw
    shape_only = torch.empty(1, 1, int(h), int(w), device=tokens.device, dtype=tokens.dtype)
    cos, sin = backbone.base.rope_embeddings(shape_only)  # [h*w, head_dim] each
    if positions is not None:  # [B, 1, K, head_dim]: broadcast over the heads
        cos, sin = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
    return {"attention_mask": None, "position_embeddings": (cos, sin)}


FAMILY = register_family(HFFamily(
    name="dinov3_vit",
    prefix=_prefix,
    layer_kwargs=_rotary,
    positions_in_blocks=True,
    layout=HFLayout(blocks=("model.layer",)),
    aliases=(  # preprocessing: the checkpoint's own preprocessor_config.json
        ModelEntry("dinov3-vits16", "dinov3_vit", 12, 6, 384, 16, ("cls",) + ("reg",) * 4,
                   "facebook/dinov3-vits16-pretrain-lvd1689m"),
        ModelEntry("dinov3-vitb16", "dinov3_vit", 12, 12, 768, 16, ("cls",) + ("reg",) * 4,
                   "facebook/dinov3-vitb16-pretrain-lvd1689m"),
    ),
))
