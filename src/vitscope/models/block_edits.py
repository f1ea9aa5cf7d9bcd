"""Hooks that apply the edits of an intervention (``backbone.intervene``) at the canonical sites of pre-norm blocks.

The same modules :mod:`vitscope.models.block_hooks` reads (:class:`BlockModules`) are where edits happen: a
forward hook that returns a tensor replaces the module's output, a pre-hook that returns arguments replaces its
input. Edit hooks are registered in front of every other hook, so a recording open at the same time sees the
edited tensors. A site the model never materialises is edited through the next one: ``resid_mid`` by replacing the
attention branch with ``edit(resid_pre + attn_out) - resid_pre``; a branch scaled by a LayerScale parameter
(BEiT's lambda) by dividing the edit by that parameter. The kernel's sites (``attn.q|k|v|pattern``) are the
adapter's (:data:`AttentionEditor`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from vitscope.hooks.edits import EditError, Edits
from vitscope.hooks.names import ATTENTION_SITES
from vitscope.hooks.record import Removable
from vitscope.models.block_hooks import BlockModules, merge_heads, sites_per_block, split_heads

__all__ = ["AttentionEditor", "install_block_edits", "replace_first", "replace_input"]

#: install(block_index, edits) -> handles; edits blocks.{i}.attn.q|k|v|pattern inside the kernel
AttentionEditor = Callable[[int, Edits], list[Removable]]


def replace_first(out: Any, value: torch.Tensor) -> Any:
    """A module output with its (first) tensor replaced by ``value``."""
    if isinstance(out, tuple):
        return (value, *out[1:])
    if isinstance(out, list):
        return [value, *out[1:]]
    return value


def _first(x: Any) -> torch.Tensor:
    return x[0] if isinstance(x, (tuple, list)) else x


def replace_input(args: tuple, kwargs: dict, value: torch.Tensor) -> tuple[tuple, dict]:
    """A block's call arguments with its hidden states replaced by ``value``."""
    if args:
        return (value, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": value}


def _input_of(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _output_edit(names: list[str], edits: Edits) -> Callable:
    """A forward hook applying the edits of ``names`` in order to a module's (first) output."""
    def hook(m: nn.Module, args: Any, out: Any) -> Any:
        x = _first(out)
        y = x
        for name in names:
            y = edits.apply(name, y)
        return None if y is x else replace_first(out, y)
    return hook


def install_block_edits(blocks: list[BlockModules], edits: Edits, edit_attention: AttentionEditor,
                        final_norm: nn.Module | None) -> list[Removable]:
    """Register the hooks that apply ``edits``; return the handles (remove them to end the intervention).

    Raises:
        EditError: ``final_norm`` edited where the model applies its final norm to the pooled token only (checked
            before any hook is registered).
    """
    if edits.wants("final_norm") and final_norm is None:
        raise EditError("'final_norm' cannot be edited on this model: its final norm is applied to the pooled "
                        "token only (CLIP-like towers); edit the last block's resid_post instead")
    per_block = sites_per_block(edits.names)
    handles: list[Removable] = []
    if edits.wants("embed") or "resid_pre" in per_block.get(0, set()):
        handles.append(blocks[0].layer.register_forward_pre_hook(
            _input_edit(["embed", "blocks.0.resid_pre"], edits), with_kwargs=True, prepend=True))
    for i, sites in sorted(per_block.items()):
        handles += _edit_block(i, blocks[i], sites, edits)
        if sites & ATTENTION_SITES:
            handles += edit_attention(i, edits)
    if final_norm is not None and edits.wants("final_norm"):
        handles.append(final_norm.register_forward_hook(_output_edit(["final_norm"], edits), prepend=True))
    return handles


def _input_edit(names: list[str], edits: Edits) -> Callable:
    def hook(m: nn.Module, args: tuple, kwargs: dict) -> Any:
        x = _input_of(args, kwargs)
        y = x
        for name in names:
            y = edits.apply(name, y)
        return None if y is x else replace_input(args, kwargs, y)
    return hook


def _scaled_branch_edit(names: list[str], scale: torch.Tensor | None, edits: Edits,
                        residual: dict[str, torch.Tensor] | None = None, mid: str | None = None) -> Callable:
    """Edits of a branch output (``attn_out`` / ``mlp_out``, after the LayerScale ``scale``) and, with ``mid``, of
    ``resid_mid = resid_pre + attn_out`` through the branch."""
    def hook(m: nn.Module, args: Any, out: Any) -> Any:
        y = _first(out)
        branch = scale * y if scale is not None else y  # the branch the block adds, as the models compute it
        edited = branch
        for name in names:
            edited = edits.apply(name, edited)
        if mid is not None and edits.wants(mid):
            pre = residual.pop("pre")
            whole = pre + edited
            changed = edits.apply(mid, whole)
            if changed is not whole:
                edited = changed - pre
        if edited is branch:
            return None
        return replace_first(out, edited / scale if scale is not None else edited)
    return hook


def _edit_block(i: int, b: BlockModules, sites: set[str], edits: Edits) -> list[Removable]:
    p = f"blocks.{i}."
    handles: list[Removable] = []
    if "resid_pre" in sites and i > 0:
        handles.append(b.layer.register_forward_pre_hook(_input_edit([p + "resid_pre"], edits), with_kwargs=True,
                                                         prepend=True))
    residual: dict[str, torch.Tensor] = {}
    if "resid_mid" in sites:  # the block's input, kept for resid_mid = resid_pre + attn_out (after its edit)
        def keep(m: nn.Module, args: tuple, kwargs: dict) -> None:
            residual["pre"] = _input_of(args, kwargs)
        handles.append(b.layer.register_forward_pre_hook(keep, with_kwargs=True))  # after resid_pre's edit
    if "norm1" in sites:
        handles.append(b.norm1.register_forward_hook(_output_edit([p + "norm1"], edits), prepend=True))
    if "norm2" in sites:
        handles.append(b.norm2.register_forward_hook(_output_edit([p + "norm2"], edits), prepend=True))
    if "attn.heads" in sites:
        def heads(m: nn.Module, args: tuple) -> Any:
            split = split_heads(args[0], b.num_heads)
            y = edits.apply(p + "attn.heads", split)
            return None if y is split else (merge_heads(y), *args[1:])
        handles.append(b.attn_out_proj.register_forward_pre_hook(heads, prepend=True))
    if sites & {"attn_out", "resid_mid"}:
        handles.append(b.attn_end.register_forward_hook(
            _scaled_branch_edit([p + "attn_out"], b.attn_scale, edits, residual, p + "resid_mid"), prepend=True))
    if "mlp.post" in sites:
        def post(m: nn.Module, args: tuple) -> Any:
            y = edits.apply(p + "mlp.post", args[0])
            return None if y is args[0] else (y, *args[1:])
        handles.append(b.mlp_out_proj.register_forward_pre_hook(post, prepend=True))
    if "mlp_out" in sites:
        handles.append(b.mlp_end.register_forward_hook(_scaled_branch_edit([p + "mlp_out"], b.mlp_scale, edits),
                                                       prepend=True))
    if "resid_post" in sites:
        handles.append(b.layer.register_forward_hook(_output_edit([p + "resid_post"], edits), prepend=True))
    return handles
