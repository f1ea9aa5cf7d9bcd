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
tensors. Contexts nest: every open recording and intervention on a block holds its own entry (outer first), the
edits apply in that order, every recording is filled, and leaving one context removes its entry alone.
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
#: how a Hugging Face model's attention patterns are read, as results.json records it (``models[].pattern_kernel``)
RECORDING_KERNEL = (f"{IMPL_NAME}: HF eager attention's computation (float32 softmax), run in a block while its "
                    "pattern is recorded or edited; the model's own kernel otherwise")

# id(attention module) -> the open recordings, outer first: (callback(q, k, v, pattern or None), pattern wanted)
_ACTIVE: dict[int, list[tuple[Callable[..., None], bool]]] = {}
# id(attention module) -> the open interventions, outer first: (their edits, the block's name prefix)
_EDITING: dict[int, list[tuple[Edits, str]]] = {}
# id(attention module) -> the model's own kernel, while any context routes the module to vitscope's
_ORIGINAL: dict[int, str] = {}


def own_kernel(config: Any) -> str:
    """The attention kernel a model runs by itself (``config._attn_implementation``: ``"sdpa"``, ``"eager"``,
    ``"flash_attention_2"``...), also while a recording routes a block to vitscope's."""
    current = getattr(config, "_attn_implementation", None) or "eager"
    if current != IMPL_NAME:
        return current
    return next(iter(_ORIGINAL.values()), "eager")  # mid-recording: the kernel vitscope's routing restores


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
    recordings, editings = _ACTIVE.get(id(module), []), _EDITING.get(id(module), [])
    original = _ORIGINAL.get(id(module), "eager")
    for edits, p in editings:  # the interventions' q, k, v first: recordings and the kernel see the edited ones
        query, key, value = (edits.apply(p + site, t) for site, t in (("q", query), ("k", key), ("v", value)))
    pattern_edits = [(edits, p) for edits, p in editings if edits.wants(p + "pattern")]
    want_pattern = any(wanted for _, wanted in recordings)
    if not (want_pattern or pattern_edits):  # no pattern needed: the model's own kernel runs
        fn = ALL_ATTENTION_FUNCTIONS.get_interface(original, None) if original != "eager" else None
        if fn is not None:
            out, weights = fn(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
            for callback, _ in recordings:
                callback(query, key, value, None)
            return out, weights
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    pattern = _pattern(query, key, attention_mask, scaling)
    for edits, p in pattern_edits:  # used as returned: the values are mixed by the edited pattern, not renormalised
        pattern = edits.apply(p + "pattern", pattern)
    weights = pattern.to(query.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    out = torch.matmul(weights, value).transpose(1, 2).contiguous()
    for callback, wanted in recordings:
        callback(query, key, value, pattern if wanted else None)
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


def _opened(attn_module: nn.Module, held: dict[int, list[Any]], entry: tuple) -> list[Removable]:
    """Add ``entry`` (a recording's or an intervention's) to the module's open contexts and route the module to
    vitscope's kernel; removing the hooks removes that entry alone, and the last context to go restores the model's
    own kernel (also after an exception inside the forward)."""
    key = id(attn_module)
    config = attn_module.config
    original = _ORIGINAL.setdefault(key, config._attn_implementation or "eager")
    held.setdefault(key, []).append(entry)

    def cleanup():
        mine = held.get(key, [])
        for i, other in enumerate(mine):
            if other is entry:
                del mine[i]
                break
        if not mine:
            held.pop(key, None)
        if key not in _ACTIVE and key not in _EDITING:
            _ORIGINAL.pop(key, None)
            config._attn_implementation = original

    return _route(attn_module, original, cleanup)


def edit_hf_attention(attn_module: nn.Module, block: int, edits: Edits) -> list[Removable]:
    """Route ``attn_module`` through vitscope's kernel while ``edits`` change ``blocks.{block}.attn.q|k|v|pattern``.

    q, k and v are edited as they enter the kernel; the model's own kernel then runs on them, unless the pattern is
    edited, which makes this block run the eager-equivalent kernel (the pattern multiplies the values as returned).
    """
    return _opened(attn_module, _EDITING, (edits, f"blocks.{block}.attn."))


def capture_hf_attention(attn_module: nn.Module, block: int, rec: Record) -> list[Removable]:
    """Route ``attn_module`` through the recording kernel while ``rec`` is open.

    Fills ``blocks.{block}.attn.q|k|v`` (``[B, H, N, Dh]``, as they enter the kernel) and
    ``blocks.{block}.attn.pattern`` (``[B, H, N, N]`` float32) when requested.
    """
    p = f"blocks.{block}.attn."
    want_pattern = rec.wants(p + "pattern")

    def on_attention(q, k, v, pattern):
        rec.put(p + "q", q)
        rec.put(p + "k", k)
        rec.put(p + "v", v)
        if pattern is not None:
            rec.put(p + "pattern", pattern)

    return _opened(attn_module, _ACTIVE, (on_attention, want_pattern))
