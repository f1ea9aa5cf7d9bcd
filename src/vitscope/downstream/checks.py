"""Checks shared by the whole-benchmark probes (retrieval, DAVIS, SPair, ``probe_sweep``)."""

from __future__ import annotations

from vitscope.errors import VitscopeValueError
from vitscope.models.backbone import Backbone

__all__ = ["require_blocks", "tiling_scale"]


def require_blocks(backbone: Backbone, task: str) -> None:
    """Raise a one-line ValueError when ``backbone`` has no transformer blocks to probe.

    The probes cache ``blocks.{i}.<site>`` token sequences; a CNN's ``stages.{i}`` maps differ in grid and
    width from stage to stage, which the per-block feature cache (one grid per entry) does not hold.
    """
    spec = backbone.spec
    if not spec.is_transformer:
        raise VitscopeValueError(f"{task} probes read transformer blocks; {spec.name} is a CNN (stages.{{i}} maps), "
                                 "which the per-block probes do not support: use vitscope analyze (cka, "
                                 "mean_activation) instead")


def tiling_scale(tiling: bool | float | None) -> float | None:
    """``tiling`` option -> frame scale: False / None / 0 = no tiling, True = the paper's 2, a number >= 1 = it.

    Raises:
        ValueError: a number below 1 (other than 0).
    """
    if tiling is None or tiling is False or tiling == 0:
        return None
    if tiling is True:
        return 2.0
    if not float(tiling) >= 1:
        raise VitscopeValueError("tiling must be a scale >= 1 (frame side / model input side; the paper: 2), got "
                                 f"{tiling!r}")
    return float(tiling)
