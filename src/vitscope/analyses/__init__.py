"""Mergeable streaming analyses (DESIGN.md idea 3) and their registry."""

from vitscope.analyses.activation import MeanActivation
from vitscope.analyses.attention_stats import AttentionStats, AttentionStatsResult
from vitscope.analyses.base import Accumulator, Batch, Result
from vitscope.analyses.registry import ANALYSES, default_analyses, get_analysis

__all__ = [
    "ANALYSES",
    "Accumulator",
    "AttentionStats",
    "AttentionStatsResult",
    "Batch",
    "MeanActivation",
    "Result",
    "default_analyses",
    "get_analysis",
]
