"""Where things live inside Hugging Face vision transformers: the modules a family's
:class:`~vitscope.models.layout_names.HFLayout` names, found in a model (several names are tried in order; the
first one present wins)."""

from __future__ import annotations

from torch import nn

from vitscope.errors import VitscopeTypeError
from vitscope.models.block_hooks import BlockModules
from vitscope.models.layout_names import HFLayout

__all__ = ["attention_module", "block_modules", "final_norm_module", "find_base", "find_layers", "find_module"]


def find_module(module: nn.Module, names: tuple[str, ...], what: str) -> nn.Module:
    """The first child of ``module`` named in ``names`` (a one-line error naming them when there is none)."""
    for n in names:
        sub = getattr(module, n, None)
        if isinstance(sub, nn.Module):
            return sub
    raise VitscopeTypeError(f"{type(module).__name__} has no {what} (looked for {', '.join(names)}); its family's "
                            "descriptor must name it (HFLayout), or use vitscope.wrap(module, layout=...)")


def find_base(model: nn.Module) -> nn.Module:
    """The module holding ``embeddings`` (the model itself or its ``vit``/``vision_model``/... child)."""
    if hasattr(model, "embeddings"):
        return model
    for child in model.children():
        if hasattr(child, "embeddings"):
            return child
    raise VitscopeTypeError(f"{type(model).__name__} has no 'embeddings' module: not a Hugging Face ViT-style model")


def find_layers(base: nn.Module, layout: HFLayout = HFLayout()) -> nn.ModuleList:
    """The list of transformer blocks (the first of ``layout.blocks`` that exists)."""
    for path in layout.blocks:
        obj: object = base
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, nn.ModuleList):
            return obj
    raise VitscopeTypeError(f"cannot find the transformer blocks of {type(base).__name__} (looked for "
                            f"{', '.join(layout.blocks)}); its family's descriptor must name them (HFLayout.blocks)")


def block_modules(layer: nn.Module, layout: HFLayout = HFLayout(), num_heads: int = 0) -> BlockModules:
    """Describe one HF block for :func:`~vitscope.models.block_hooks.install_block_hooks`."""
    attn = find_module(layer, layout.attention, "attention module")
    mlp = find_module(layer, layout.mlp, "MLP")
    lam1, lam2 = getattr(layer, "lambda_1", None), getattr(layer, "lambda_2", None)  # BEiT's layer scale
    return BlockModules(
        layer=layer,
        norm1=find_module(layer, layout.norm1, "pre-attention norm"),
        norm2=find_module(layer, layout.norm2, "pre-MLP norm"),
        attn_end=getattr(layer, layout.layer_scale[0], attn),
        mlp_end=getattr(layer, layout.layer_scale[1], mlp),
        mlp_out_proj=find_module(mlp, layout.mlp_out, "MLP output projection"),
        attn_scale=lam1 if isinstance(lam1, nn.Parameter) else None,
        mlp_scale=lam2 if isinstance(lam2, nn.Parameter) else None,
        attn_out_proj=find_module(attn, layout.o_proj, "attention output projection"), num_heads=num_heads,
    )


def attention_module(layer: nn.Module, layout: HFLayout = HFLayout()) -> nn.Module:
    return find_module(layer, layout.attention, "attention module")


def final_norm_module(base: nn.Module, layout: HFLayout = HFLayout()) -> tuple[nn.Module, bool]:
    """``(norm, applied_to_sequence)`` of the module holding ``embeddings``."""
    return find_module(base, layout.final_norm, "final norm"), layout.final_norm_on_sequence
