"""Name -> analysis class table, used by the CLI, the engine and the contract tests."""

from __future__ import annotations

import difflib
from typing import Any

from vitscope.analyses.activation import MeanActivation
from vitscope.analyses.attention_stats import AttentionStats
from vitscope.analyses.base import Accumulator
from vitscope.models.spec import ModelSpec

__all__ = ["ANALYSES", "default_analyses", "get_analysis"]

ANALYSES: dict[str, type[Accumulator]] = {
    MeanActivation.name: MeanActivation,
    AttentionStats.name: AttentionStats,
}


def get_analysis(name: str, **kwargs: Any) -> Accumulator:
    """Instantiate the analysis registered as ``name`` with ``kwargs``.

    Raises:
        ValueError: unknown name; the one-line message suggests the closest name and lists all.
    """
    try:
        cls = ANALYSES[name]
    except KeyError:
        known = sorted(ANALYSES)
        close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.4)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ValueError(f"unknown analysis '{name}'.{hint} Known analyses: {', '.join(known)}.") from None
    return cls(**kwargs)


def default_analyses(spec: ModelSpec) -> list[Accumulator]:
    """One default-configured instance of every registered analysis that supports ``spec``."""
    instances = [cls() for cls in ANALYSES.values()]
    return [a for a in instances if a.supports(spec)]
