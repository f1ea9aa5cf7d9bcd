"""Mergeable streaming analyses (DESIGN.md idea 3) and their registry."""

from vitscope.analyses.activation import MeanActivation
from vitscope.analyses.attention_focus import AttentionFocus, AttentionFocusResult
from vitscope.analyses.attention_geometry import (
    AlignedAttention,
    AlignedAttentionResult,
    AttentionDistance,
    AttentionDistanceResult,
)
from vitscope.analyses.attention_maps import AttentionMapsResult, CLSAttentionMaps, SpatialAverageMaps
from vitscope.analyses.attention_stats import AttentionStats, AttentionStatsResult
from vitscope.analyses.attention_suite import attention_suite, link_attention_plans
from vitscope.analyses.base import Accumulator, Batch, Result
from vitscope.analyses.registry import ANALYSES, GROUPS, default_analyses, get_analysis
from vitscope.analyses.rollout_analysis import AttentionRollout, AttentionRolloutResult
from vitscope.analyses.saliency import SaliencyIoU, SaliencyIoUResult

__all__ = [
    "ANALYSES",
    "GROUPS",
    "Accumulator",
    "AlignedAttention",
    "AlignedAttentionResult",
    "AttentionDistance",
    "AttentionDistanceResult",
    "AttentionFocus",
    "AttentionFocusResult",
    "AttentionMapsResult",
    "AttentionRollout",
    "AttentionRolloutResult",
    "AttentionStats",
    "AttentionStatsResult",
    "Batch",
    "CLSAttentionMaps",
    "MeanActivation",
    "Result",
    "SaliencyIoU",
    "SaliencyIoUResult",
    "SpatialAverageMaps",
    "attention_suite",
    "default_analyses",
    "get_analysis",
    "link_attention_plans",
]
