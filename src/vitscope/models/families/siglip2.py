"""SigLIP 2 NaFlex vision tower: no prefix token; each image keeps its aspect ratio and gets its own token grid of
at most ``max_num_patches`` patches (the checkpoint's processor; the config's ``num_patches`` when it has none).

The model takes patchified pixels with ``spatial_shapes`` and a ``pixel_attention_mask`` that marks the padding the
published processor adds to fill the budget. vitscope runs every batch at one grid (``vitscope.run`` groups images by
grid), so it patchifies ``[B, 3, H, W]`` itself and no token is padding: every analysis, probe and map sees the
image's tokens only, equal to the unpadded tokens of the processor's padded batch (tested). Fixed-resolution SigLIP 2
checkpoints are SigLIP models (``siglip2-b16-256``: :mod:`vitscope.models.families.siglip`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from vitscope.models.entry import ModelEntry
from vitscope.models.families._common import mean_token_head
from vitscope.models.family import HFFamily, load_auto, register_family
from vitscope.models.hf_pretrained import from_pretrained


def patchify(pixels: torch.Tensor, patch: int) -> torch.Tensor:
    """``[B, C, H, W]`` -> ``[B, (H/p)*(W/p), p*p*C]``: patches row by row, each flattened as (row, column,
    channel), the layout of the published processor's ``pixel_values``."""
    b, c, h, w = pixels.shape
    x = pixels.reshape(b, c, h // patch, patch, w // patch, patch)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(b, (h // patch) * (w // patch), patch * patch * c)


def _pixel_values(backbone: Any, pixels: torch.Tensor) -> torch.Tensor:
    return patchify(pixels, backbone.spec.patch_size)


def _grid_inputs(backbone: Any, fn: Any, pixels: torch.Tensor) -> dict[str, Any]:
    """Every image's grid (``spatial_shapes``) and, for the model's forward, a mask of ones: no padding."""
    import inspect

    b, p = pixels.shape[0], backbone.spec.patch_size
    h, w = pixels.shape[-2] // p, pixels.shape[-1] // p
    kw: dict[str, Any] = {"spatial_shapes": torch.tensor([[h, w]], dtype=torch.long, device=pixels.device).expand(b, 2)}
    if "pixel_attention_mask" in inspect.signature(fn).parameters:
        kw["pixel_attention_mask"] = torch.ones(b, h * w, dtype=torch.long, device=pixels.device)
    return kw


def _native_size(config: Any) -> tuple[int, int]:
    """The square input whose grid has the config's ``num_patches`` patches (its position table's size)."""
    side = math.isqrt(int(config.num_patches)) * int(config.patch_size)
    return side, side


def _load(source: str, config: Any, **hub: Any):
    """A full SigLIP 2 checkpoint (image and text) loads its vision tower; a classifier or a vision-only one as its
    config says."""
    import transformers as tf

    classifier = any(a.endswith("ForImageClassification") for a in config.architectures or [])
    if config.model_type == "siglip2" and not classifier:
        return from_pretrained(tf.Siglip2Model, source, **hub).vision_model
    return load_auto(source, config, **hub)


FAMILY = register_family(HFFamily(
    name="siglip2",
    preprocessing={"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "interpolation": "bilinear"},
    prefix=lambda config: (),
    load=_load,
    head=mean_token_head,
    forward_kwargs=_grid_inputs,
    pixel_values=_pixel_values,
    input_size=_native_size,
    token_budget=lambda config: int(config.num_patches),
    aliases=(  # preprocessing and token budget: the checkpoint's own preprocessor_config.json
        ModelEntry("siglip2-b16-naflex", "siglip2", 12, 12, 768, 16, (), "google/siglip2-base-patch16-naflex"),
        ModelEntry("siglip2-so400m-16-naflex", "siglip2", 27, 16, 1152, 16, (),
                   "google/siglip2-so400m-patch16-naflex"),
    ),
))
