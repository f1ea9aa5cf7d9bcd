"""Feature visualisation for ViTs and CNNs (paper 001): objectives, the published recipe, top images."""

from vitscope.featviz.augment import AugmentConfig, augment
from vitscope.featviz.objectives import (
    ChannelObjective,
    ClassLogit,
    Combination,
    ConvChannel,
    Direction,
    FFNChannel,
    Key,
    Objective,
    Query,
    Value,
    parse_objective,
)
from vitscope.featviz.render import FeatvizConfig, FeatvizResult, StagedForward, StepInfo, evaluate, frozen, render
from vitscope.featviz.spatial import (
    SpatialCurve,
    linearity,
    spatial_information,
    spatial_information_by_block,
    unit_maps,
)

__all__ = [
    "AugmentConfig", "ChannelObjective", "ClassLogit", "Combination", "ConvChannel", "Direction", "FFNChannel",
    "FeatvizConfig", "FeatvizResult", "Key", "Objective", "Query", "SpatialCurve", "StagedForward", "StepInfo",
    "Value", "augment", "evaluate", "frozen", "linearity", "parse_objective", "render", "spatial_information",
    "spatial_information_by_block", "unit_maps",
]
