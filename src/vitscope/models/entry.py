"""One registered model name (:func:`vitscope.models.registry.registry` collects them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ModelEntry"]


@dataclass(frozen=True)
class ModelEntry:
    """One registered name.

    Attributes:
        name: what ``load_model`` accepts.
        family: adapter family.
        blocks, heads, width, patch: architecture summary for ``vitscope models``.
        prefix: prefix tokens in canonical order.
        hub_id: Hugging Face hub id (None for built-in models).
        preprocessing: mean/std/size/crop/interpolation the papers used (overrides the checkpoint's).
        builder: zero-argument constructor of a Backbone for built-in models.
        description: one line for ``vitscope models``.
        zoo: a trained tiny-zoo model (its weights must have been built).
        source: where it comes from, for ``vitscope models`` (default: the hub id, else ``built-in``).
        available: whether it loads offline now (default: it has a builder, or its hub id is cached).
    """

    name: str
    family: str
    blocks: int
    heads: int
    width: int
    patch: int
    prefix: tuple[str, ...]
    hub_id: str | None = None
    preprocessing: dict[str, Any] = field(default_factory=dict)
    builder: Callable[[], Any] | None = None
    description: str = ""
    zoo: bool = False
    source: str | None = None
    available: Callable[[], bool] | None = None
