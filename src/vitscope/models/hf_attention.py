"""Exact attention patterns from Hugging Face models under any attention kernel.

transformers 5.x routes every attention call through ``ALL_ATTENTION_FUNCTIONS`` keyed by
``config._attn_implementation``; its default, sdpa, never materialises the pattern and returns
``attentions=None``. vitscope registers one more implementation, ``"vitscope_record"``. While a
recording needs a block's attention, a pre-hook on that block's attention module points the
config at it for that one call (the mask was already built for the model's own kernel; sdpa and
eager masks are both additive-float or boolean, handled below). It computes exactly what HF's
eager implementation computes (logits ``q k^T * scaling + mask``, float32 softmax), so the
pattern equals eager attention, every bias included (BEiT's relative position bias arrives as
the mask), and the output differs from sdpa's only by kernel rounding. One pass, no recompute.

An intervention (``backbone.intervene``) edits ``attn.q|k|v|pattern`` in the same kernel: q, k and v as they enter
it (then the model's own kernel runs on them), the pattern after the softmax (then this block runs the eager
computation with the edited pattern multiplying the values). A recording open at the same time sees the edited
tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from vitscope.functional.image_groups import images_per_group
from vitscope.hooks.edits import Edits
from vitscope.hooks.record import CallbackRemovable, Record, Removable

IMPL_NAME = "vitscope_record"

# id(attention module) -> (callback(q, k, v, pattern or None), whether the pattern is wanted, original kernel)
_ACTIVE: dict[int, tuple[Callable[..., None], bool, str]] = {}
# id(attention module) -> (the intervention's edits, its block's name prefix, original kernel)
_EDITING: dict[int, tuple[Edits, str, str]] = {}


def _softmax(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, scaling: float) -> torch.Tensor:
    logits = torch.matmul(query, key.transpose(2, 3)) * scaling
    if mask is not None:
        if mask.dtype == torch.bool:
            logits = logits.masked_fill(~mask, float("-inf"))
        else:
            logits = logits + mask
    return nn.functional.softmax(logits, dim=-1, dtype=torch.float32)


def _pattern(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, scaling: float) -> torch.Tensor:
    """``softmax(q k^T * scaling + mask)`` in float32, ``[B, H, N, N]``, in groups of images when it is large, so
    the logits of the whole batch (as large as the pattern) never exist next to it."""
    b, heads, n = query.shape[0], query.shape[1], query.shape[2]
    step = images_per_group(heads * n * key.shape[2] * 4)
    if b <= step:
        return _softmax(query, key, mask, scaling)
    pattern = torch.empty(b, heads, n, key.shape[2], dtype=torch.float32, device=query.device)
    for i in range(0, b, step):
        part = mask[i:i + step] if mask is not None and mask.dim() == 4 and mask.shape[0] == b else mask
        pattern[i:i + step] = _softmax(query[i:i + step], key[i:i + step], part, scaling)
    return pattern


def _recording_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    recording, editing = _ACTIVE.get(id(module)), _EDITING.get(id(module))
    callback, want_pattern, original = recording if recording is not None else (None, False, editing[2])
    edit_pattern = False
    if editing is not None:  # the intervention's q, k, v first: recording and the kernel see the edited ones
        edits, p, original = editing
        query, key, value = (edits.apply(p + site, t) for site, t in (("q", query), ("k", key), ("v", value)))
        edit_pattern = edits.wants(p + "pattern")
    if not (want_pattern or edit_pattern):  # no pattern needed: the model's own kernel runs
        fn = ALL_ATTENTION_FUNCTIONS.get_interface(original, None) if original != "eager" else None
        if fn is not None:
            out, weights = fn(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
            if callback is not None:
                callback(query, key, value, None)
            return out, weights
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    pattern = _pattern(query, key, attention_mask, scaling)
    if edit_pattern:  # used as returned: the values are mixed by the edited pattern, not renormalised
        pattern = edits.apply(p + "pattern", pattern)
    weights = pattern.to(query.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    out = torch.matmul(weights, value).transpose(1, 2).contiguous()
    if callback is not None:
        callback(query, key, value, pattern if want_pattern else None)
    return out, weights


AttentionInterface.register(IMPL_NAME, _recording_attention)


def _route(attn_module: nn.Module, original: str, cleanup: Callable[[], None]) -> list[Removable]:
    """Hooks that point ``attn_module``'s config at vitscope's kernel for each of its calls, and ``cleanup``."""
    config = attn_module.config

    def pre(m, args, kwargs):
        config._attn_implementation = IMPL_NAME

    def post(m, args, kwargs, out):
        config._attn_implementation = original

    return [attn_module.register_forward_pre_hook(pre, with_kwargs=True),
            attn_module.register_forward_hook(post, with_kwargs=True), CallbackRemovable(cleanup)]


def _original_kernel(attn_module: nn.Module) -> str:
    """The model's own kernel, also while another context has routed the module to vitscope's."""
    for held in (_ACTIVE.get(id(attn_module)), _EDITING.get(id(attn_module))):
        if held is not None:
            return held[-1]
    return attn_module.config._attn_implementation or "eager"


def edit_hf_attention(attn_module: nn.Module, block: int, edits: Edits) -> list[Removable]:
    """Route ``attn_module`` through vitscope's kernel while ``edits`` change ``blocks.{block}.attn.q|k|v|pattern``.

    q, k and v are edited as they enter the kernel; the model's own kernel then runs on them, unless the pattern is
    edited, which makes this block run the eager-equivalent kernel (the pattern multiplies the values as returned).
    """
    original = _original_kernel(attn_module)
    config = attn_module.config
    _EDITING[id(attn_module)] = (edits, f"blocks.{block}.attn.", original)

    def cleanup():
        _EDITING.pop(id(attn_module), None)
        if id(attn_module) not in _ACTIVE:
            config._attn_implementation = original  # also after an exception inside the forward

    return _route(attn_module, original, cleanup)


def capture_hf_attention(attn_module: nn.Module, block: int, rec: Record) -> list[Removable]:
    """Route ``attn_module`` through the recording kernel while ``rec`` is open.

    Fills ``blocks.{block}.attn.q|k|v`` (``[B, H, N, Dh]``, as they enter the kernel) and
    ``blocks.{block}.attn.pattern`` (``[B, H, N, N]`` float32) when requested.
    """
    p = f"blocks.{block}.attn."
    config = attn_module.config
    original = _original_kernel(attn_module)
    want_pattern = rec.wants(p + "pattern")

    def on_attention(q, k, v, pattern):
        rec.put(p + "q", q)
        rec.put(p + "k", k)
        rec.put(p + "v", v)
        if pattern is not None:
            rec.put(p + "pattern", pattern)

    _ACTIVE[id(attn_module)] = (on_attention, want_pattern, original)

    def cleanup():
        _ACTIVE.pop(id(attn_module), None)
        if id(attn_module) not in _EDITING:
            config._attn_implementation = original  # also after an exception inside the forward

    return _route(attn_module, original, cleanup)
