"""Mergeable streaming analyses (docs/architecture.md), their registry, parameters and result types.

Every analysis registered in :data:`ANALYSES` (what ``vitscope analyze --analyses NAME`` runs) is importable
from here by its class name, together with its Result class; they live in sub-packages by family
(``attention``, ``representation``, ``activations``, ``probes``, ``masking``). The cached-feature entry points
(k-NN, linear probe, clustering, cross-model CKA) are functions beside their analyses. The probes that need a
whole benchmark at once (revisited retrieval, DAVIS propagation, SPair keypoints) extract features through the
engine and live one floor up, in :mod:`vitscope.downstream`.
"""

# Imported in registration order: the order of the defaults of ``vitscope analyze`` and of their results.
# isort: off
from vitscope.analyses.activations.mean import MeanActivation
from vitscope.analyses.attention.stats import AttentionStats, AttentionStatsResult
from vitscope.analyses.attention.maps import AttentionMapsResult, CLSAttentionMaps, SpatialAverageMaps
from vitscope.analyses.attention.geometry import (
    AlignedAttention,
    AlignedAttentionResult,
    AttentionDistance,
    AttentionDistanceResult,
)
from vitscope.analyses.attention.saliency import SaliencyIoU, SaliencyIoUResult
from vitscope.analyses.attention.focus import AttentionFocus, AttentionFocusResult
from vitscope.analyses.attention.rollout import AttentionRollout, AttentionRolloutResult
from vitscope.analyses.representation.cka import BlockCKA, CKAResult, cka_between, cross_model_cka
from vitscope.analyses.representation.residual import ResidualCKA, ResidualResult
from vitscope.analyses.probes.clustering import Clustering, clustering_probe
from vitscope.analyses.probes.knn import KnnProbe, knn_probe
from vitscope.analyses.probes.linear import LinearProbe, linear_probe
from vitscope.analyses.activations.top import TopActivations, TopActivationsResult
from vitscope.analyses.attention.interrelation import Interrelation, InterrelationResult
from vitscope.analyses.masking.interrelation import InterrelationMasking, InterrelationMaskingResult
from vitscope.analyses.masking.foreground import ForegroundMasking, ForegroundMaskingResult
from vitscope.analyses.masking.frequency import FrequencyFiltering, FrequencyFilteringResult
# isort: on
from vitscope.analyses.attention.suite import attention_suite
from vitscope.analyses.base import Analysis, Batch, Result
from vitscope.analyses.probes.result import ProbeResult, best_block_table
from vitscope.analyses.registry import (
    ANALYSES,
    GROUPS,
    default_analyses,
    get_analysis,
    register_analysis,
)

__all__ = [
    "ANALYSES",
    "GROUPS",
    "Analysis",
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
    "BlockCKA",
    "CKAResult",
    "CLSAttentionMaps",
    "Clustering",
    "ForegroundMasking",
    "ForegroundMaskingResult",
    "FrequencyFiltering",
    "FrequencyFilteringResult",
    "Interrelation",
    "InterrelationMasking",
    "InterrelationMaskingResult",
    "InterrelationResult",
    "KnnProbe",
    "LinearProbe",
    "MeanActivation",
    "ProbeResult",
    "ResidualCKA",
    "ResidualResult",
    "Result",
    "SaliencyIoU",
    "SaliencyIoUResult",
    "SpatialAverageMaps",
    "TopActivations",
    "TopActivationsResult",
    "attention_suite",
    "best_block_table",
    "cka_between",
    "clustering_probe",
    "cross_model_cka",
    "default_analyses",
    "get_analysis",
    "knn_probe",
    "linear_probe",
    "register_analysis",
]
