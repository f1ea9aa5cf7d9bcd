"""Comparing models over one dataset (paper 002's comparison): one pass per model, shared-axis curves."""

from vitscope.comparison.analyses import compare_analyses
from vitscope.comparison.curves import QUANTITIES, Comparison, Curve, ModelRun, compare_runs, relative_depth
from vitscope.comparison.pooled import PooledFeatures, PooledFeaturesResult

__all__ = [
    "QUANTITIES",
    "Comparison",
    "Curve",
    "ModelRun",
    "PooledFeatures",
    "PooledFeaturesResult",
    "compare_analyses",
    "compare_runs",
    "relative_depth",
]
