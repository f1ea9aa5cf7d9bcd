"""Hooks that fill the canonical names of a pre-norm transformer block.

Every ViT family here computes ``x + scale1 * attn(norm1(x))`` then ``+ scale2 * mlp(norm2(.))``;
adapters describe where those pieces live (:class:`BlockModules`) and supply an attention
capture (family-specific: see ``hf_attention`` and ``timm_layout``). Recording only reads
tensors the model computes anyway, so the model's output is unchanged bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from vitscope.errors import VitscopeTypeError
from vitscope.hooks.names import ATTENTION_SITES, split_block_name
from vitscope.hooks.record import Record, Removable

#: install(block_index, record) -> handles; fills blocks.{i}.attn.q|k|v|pattern
AttentionCapture = Callable[[int, Record], list[Removable]]


@dataclass
class BlockModules:
    """Where the parts of one block live in the wrapped model.

    Attributes:
        layer: the block; its input is ``resid_pre``, its output ``resid_post``.
        norm1, norm2: pre-attention and pre-MLP norms.
        attn_end: module whose output (first element when a tuple) is the attention branch.
        attn_scale: LayerScale parameter multiplied onto ``attn_end``'s output, or None.
        mlp_end: module whose output is the MLP branch.
        mlp_scale: LayerScale parameter multiplied onto ``mlp_end``'s output, or None.
        mlp_out_proj: the MLP's output projection; its input is ``mlp.post``.
        attn_out_proj: the attention's output projection; its input is ``attn.heads`` (None: not recordable).
        num_heads: attention heads (to split the output projection's input into heads).
    """

    layer: nn.Module
    norm1: nn.Module
    norm2: nn.Module
    attn_end: nn.Module
    mlp_end: nn.Module
    mlp_out_proj: nn.Module
    attn_scale: torch.Tensor | None = None
    mlp_scale: torch.Tensor | None = None
    attn_out_proj: nn.Module | None = None
    num_heads: int = 0


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


def _layer_input(args, kwargs):
    return args[0] if args else kwargs["hidden_states"]


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """The output projection's input ``[B, N, H*Dh]`` -> ``[B, H, N, Dh]`` (a view)."""
    b, n, _ = x.shape
    return x.view(b, n, heads, -1).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``[B, H, N, Dh]`` -> ``[B, N, H*Dh]``, as the output projection reads it."""
    b, h, n, d = x.shape
    return x.transpose(1, 2).reshape(b, n, h * d)


def sites_per_block(names: Iterable[str]) -> dict[int, set[str]]:
    """``{block: {site, ...}}`` of the block names among ``names`` (``blocks.3.attn.q`` -> ``{3: {"attn.q"}}``)."""
    per_block: dict[int, set[str]] = {}
    for name in names:
        parsed = split_block_name(name)
        if parsed:
            per_block.setdefault(parsed[0], set()).add(parsed[1])
    return per_block


def install_block_hooks(
    blocks: list[BlockModules],
    rec: Record,
    capture_attention: AttentionCapture,
    final_norm: nn.Module | None,
) -> list[Removable]:
    """Register hooks for every requested canonical name; return the handles."""
    per_block = sites_per_block(rec.names)
    handles: list[Removable] = []
    if rec.wants("embed"):
        handles.append(blocks[0].layer.register_forward_pre_hook(
            lambda m, a, k: rec.put("embed", _layer_input(a, k)), with_kwargs=True))
    for i, sites in sorted(per_block.items()):
        handles += _install_block(i, blocks[i], sites, rec)
        if sites & ATTENTION_SITES:
            handles += capture_attention(i, rec)
    if final_norm is not None and rec.wants("final_norm"):
        handles.append(final_norm.register_forward_hook(lambda m, a, out: rec.put("final_norm", _first(out))))
    return handles


def _install_block(i: int, b: BlockModules, sites: set[str], rec: Record) -> list[Removable]:
    p = f"blocks.{i}."
    handles: list[Removable] = []
    # resid_mid needs resid_pre and attn_out even when they were not requested.
    scratch: dict[str, torch.Tensor] = {}
    need_pre = bool(sites & {"resid_pre", "resid_mid"})
    need_attn = bool(sites & {"attn_out", "resid_mid"})

    if need_pre:
        def pre(m, args, kwargs):
            x = _layer_input(args, kwargs)
            scratch["pre"] = x
            rec.put(p + "resid_pre", x)
        handles.append(b.layer.register_forward_pre_hook(pre, with_kwargs=True))
    if "resid_post" in sites:
        handles.append(b.layer.register_forward_hook(lambda m, a, out: rec.put(p + "resid_post", _first(out))))
    if "norm1" in sites:
        handles.append(b.norm1.register_forward_hook(lambda m, a, out: rec.put(p + "norm1", out)))
    if "norm2" in sites:
        handles.append(b.norm2.register_forward_hook(lambda m, a, out: rec.put(p + "norm2", out)))
    if need_attn:
        def attn_hook(m, a, out):
            y = _first(out)
            if b.attn_scale is not None:
                y = b.attn_scale * y  # same operation, same operand order as the models
            rec.put(p + "attn_out", y)
            if "resid_mid" in sites:
                rec.put(p + "resid_mid", y + scratch.pop("pre"))
        handles.append(b.attn_end.register_forward_hook(attn_hook))
    if "attn.heads" in sites:
        if b.attn_out_proj is None:
            raise VitscopeTypeError(f"{p}attn.heads: this model's attention output projection is not known")
        handles.append(b.attn_out_proj.register_forward_pre_hook(
            lambda m, a: rec.put(p + "attn.heads", split_heads(a[0], b.num_heads))))
    if "mlp.post" in sites:
        handles.append(b.mlp_out_proj.register_forward_pre_hook(lambda m, a: rec.put(p + "mlp.post", a[0])))
    if "mlp_out" in sites:
        def mlp_hook(m, a, out):
            y = _first(out)
            rec.put(p + "mlp_out", b.mlp_scale * y if b.mlp_scale is not None else y)
        handles.append(b.mlp_end.register_forward_hook(mlp_hook))
    return handles
