"""Mergeable streaming analyses (docs/architecture.md idea 3), their registry, and the downstream probes.

Every analysis registered in :data:`ANALYSES` (what ``vitscope analyze --analyses NAME`` runs) is importable
from here by its class name, together with its Result class. The probes that need a whole benchmark at once
(revisited retrieval, DAVIS propagation, SPair keypoints) and the cached-feature entry points (k-NN, linear
probe, clustering, cross-model CKA) are functions; :func:`probe_sweep` runs every probe the data allows.
"""

# Imported in registration order: the order of the defaults of ``vitscope analyze`` and of their results.
# isort: off
from vitscope.analyses.activation import MeanActivation
from vitscope.analyses.attention_stats import AttentionStats, AttentionStatsResult
from vitscope.analyses.attention_maps import AttentionMapsResult, CLSAttentionMaps, SpatialAverageMaps
from vitscope.analyses.attention_geometry import (
    AlignedAttention,
    AlignedAttentionResult,
    AttentionDistance,
    AttentionDistanceResult,
)
from vitscope.analyses.saliency import SaliencyIoU, SaliencyIoUResult
from vitscope.analyses.attention_focus import AttentionFocus, AttentionFocusResult
from vitscope.analyses.rollout_analysis import AttentionRollout, AttentionRolloutResult
from vitscope.analyses.representation import BlockCKA, CKAResult, block_cka, cka_between, cross_model_cka
from vitscope.analyses.representation_residual import ResidualCKA, ResidualResult
from vitscope.analyses.clustering import Clustering, clustering_probe
from vitscope.analyses.probe_knn import KnnProbe, knn_probe
from vitscope.analyses.probe_linear import LinearProbe, linear_probe
from vitscope.analyses.top_activations import TopActivations, TopActivationsResult
from vitscope.analyses.interrelation import Interrelation, InterrelationResult
from vitscope.analyses.masking_interrelation import InterrelationMasking, InterrelationMaskingResult
from vitscope.analyses.masking_foreground import ForegroundMasking, ForegroundMaskingResult
from vitscope.analyses.masking_frequency import FrequencyFiltering, FrequencyFilteringResult
# isort: on
from vitscope.analyses.attention_suite import attention_suite
from vitscope.analyses.base import Accumulator, Analysis, Batch, Result
from vitscope.analyses.probe_davis import davis_probe
from vitscope.analyses.probe_keypoints import keypoint_probe
from vitscope.analyses.probe_result import ProbeResult, best_block_table
from vitscope.analyses.probe_retrieval import retrieval_probe
from vitscope.analyses.probes import probe_sweep
from vitscope.analyses.registry import (
    ANALYSES,
    GROUPS,
    default_analyses,
    expand_group,
    get_analysis,
    register_analysis,
)

__all__ = [
    "ANALYSES",
    "GROUPS",
    "Accumulator",
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
    "block_cka",
    "cka_between",
    "clustering_probe",
    "cross_model_cka",
    "davis_probe",
    "default_analyses",
    "expand_group",
    "get_analysis",
    "keypoint_probe",
    "knn_probe",
    "linear_probe",
    "probe_sweep",
    "register_analysis",
    "retrieval_probe",
]
