"""Where things live inside Hugging Face vision transformers (transformers 5.x module names).

Block parts are found by attribute name, so every HF ViT family that follows the pre-norm
layout works without a per-family table: ViT, DeiT, DINO v1, DINOv2 (+registers), CLIP and
SigLIP vision towers, ViT-MAE and BEiT.
"""

from __future__ import annotations

from torch import nn

from vitscope.errors import VitscopeTypeError
from vitscope.models.block_hooks import BlockModules

_NORM1 = ("layernorm_before", "norm1", "layer_norm1")
_NORM2 = ("layernorm_after", "norm2", "layer_norm2")
_ATTN = ("attention", "self_attn")
_FC2 = ("fc2", "weights_out")


def _pick(module: nn.Module, names: tuple[str, ...], what: str) -> nn.Module:
    for n in names:
        sub = getattr(module, n, None)
        if isinstance(sub, nn.Module):
            return sub
    raise VitscopeTypeError(f"{type(module).__name__} has no {what} (looked for {', '.join(names)}); "
                            "this layout is not supported, use vitscope.wrap(module, layout=...)")


def find_base(model: nn.Module) -> nn.Module:
    """The module holding ``embeddings`` (the model itself or its ``vit``/``vision_model``/... child)."""
    if hasattr(model, "embeddings"):
        return model
    for child in model.children():
        if hasattr(child, "embeddings"):
            return child
    raise VitscopeTypeError(f"{type(model).__name__} has no 'embeddings' module: not a Hugging Face ViT-style model")


def find_layers(base: nn.Module) -> nn.ModuleList:
    """The list of transformer blocks (``layers``, ``encoder.layer`` or ``encoder.layers``)."""
    for path in ("layers", "encoder.layer", "encoder.layers"):
        obj: object = base
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, nn.ModuleList):
            return obj
    raise VitscopeTypeError(f"cannot find the transformer blocks of {type(base).__name__}")


def block_modules(layer: nn.Module) -> BlockModules:
    """Describe one HF block for :func:`install_block_hooks`."""
    attn = _pick(layer, _ATTN, "attention module")
    mlp = _pick(layer, ("mlp",), "MLP")
    lam1, lam2 = getattr(layer, "lambda_1", None), getattr(layer, "lambda_2", None)
    return BlockModules(
        layer=layer,
        norm1=_pick(layer, _NORM1, "pre-attention norm"),
        norm2=_pick(layer, _NORM2, "pre-MLP norm"),
        attn_end=getattr(layer, "layer_scale1", attn),
        mlp_end=getattr(layer, "layer_scale2", mlp),
        mlp_out_proj=_pick(mlp, _FC2, "MLP output projection"),
        attn_scale=lam1 if isinstance(lam1, nn.Parameter) else None,
        mlp_scale=lam2 if isinstance(lam2, nn.Parameter) else None,
    )


def attention_module(layer: nn.Module) -> nn.Module:
    return _pick(layer, _ATTN, "attention module")


def final_norm_module(base: nn.Module) -> tuple[nn.Module, bool]:
    """``(norm, applied_to_sequence)``: CLIP applies ``post_layernorm`` to the pooled CLS only."""
    if hasattr(base, "layernorm"):
        return base.layernorm, True
    norm = base.post_layernorm
    applied_to_sequence = type(base).__name__.startswith("Siglip")
    return norm, applied_to_sequence
