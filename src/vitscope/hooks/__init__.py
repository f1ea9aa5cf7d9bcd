"""Hooks: the canonical hook names every adapter maps onto its modules (``blocks.{i}.attn.pattern``...; the
table is in :mod:`vitscope.hooks.names`), the :class:`Record` that ``backbone.record(...)`` yields, and the
token layout (prefix tokens first, spatial tokens row-major). Names are imported on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vitscope._lazy import lazy_exports

__all__ = ["BLOCK_SITES", "Record", "UnknownHookError", "cnn_hook_names", "expand_names",
           "grid_to_tokens", "tokens_to_grid", "transformer_hook_names"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "BLOCK_SITES": "vitscope.hooks.names",
    "Record": "vitscope.hooks.record",
    "UnknownHookError": "vitscope.hooks.names",
    "cnn_hook_names": "vitscope.hooks.names",
    "expand_names": "vitscope.hooks.names",
    "grid_to_tokens": "vitscope.hooks.tokens",
    "tokens_to_grid": "vitscope.hooks.tokens",
    "transformer_hook_names": "vitscope.hooks.names",
})

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from vitscope.hooks.names import BLOCK_SITES, UnknownHookError, cnn_hook_names, expand_names, transformer_hook_names
    from vitscope.hooks.record import Record
    from vitscope.hooks.tokens import grid_to_tokens, tokens_to_grid
