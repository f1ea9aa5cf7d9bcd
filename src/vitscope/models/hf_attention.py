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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from vitscope.functional.image_groups import images_per_group
from vitscope.hooks.record import CallbackRemovable, Record, Removable

IMPL_NAME = "vitscope_record"

# id(attention module) -> (callback(q, k, v, pattern or None), whether the pattern is wanted, original kernel)
_ACTIVE: dict[int, tuple[Callable[..., None], bool, str]] = {}


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
    callback, want_pattern, original = _ACTIVE[id(module)]
    if not want_pattern:  # only q/k/v wanted: let the model's own kernel run
        fn = ALL_ATTENTION_FUNCTIONS.get_interface(original, None) if original != "eager" else None
        if fn is not None:
            out, weights = fn(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
            callback(query, key, value, None)
            return out, weights
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    pattern = _pattern(query, key, attention_mask, scaling)
    weights = pattern.to(query.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    out = torch.matmul(weights, value).transpose(1, 2).contiguous()
    callback(query, key, value, pattern)
    return out, weights


AttentionInterface.register(IMPL_NAME, _recording_attention)


def capture_hf_attention(attn_module: nn.Module, block: int, rec: Record) -> list[Removable]:
    """Route ``attn_module`` through the recording kernel while ``rec`` is open.

    Fills ``blocks.{block}.attn.q|k|v`` (``[B, H, N, Dh]``, as they enter the kernel) and
    ``blocks.{block}.attn.pattern`` (``[B, H, N, N]`` float32) when requested.
    """
    p = f"blocks.{block}.attn."
    config = attn_module.config
    original = config._attn_implementation or "eager"
    want_pattern = rec.wants(p + "pattern")

    def on_attention(q, k, v, pattern):
        rec.put(p + "q", q)
        rec.put(p + "k", k)
        rec.put(p + "v", v)
        if pattern is not None:
            rec.put(p + "pattern", pattern)

    def pre(m, args, kwargs):
        config._attn_implementation = IMPL_NAME

    def post(m, args, kwargs, out):
        config._attn_implementation = original

    _ACTIVE[id(attn_module)] = (on_attention, want_pattern, original)

    def cleanup():
        _ACTIVE.pop(id(attn_module), None)
        config._attn_implementation = original  # also after an exception inside the forward

    return [
        attn_module.register_forward_pre_hook(pre, with_kwargs=True),
        attn_module.register_forward_hook(post, with_kwargs=True),
        CallbackRemovable(cleanup),
    ]
