"""The masking analyses (they re-run the bound model) and the ``masking`` group of ``vitscope analyze``.

They are kept out of :data:`~vitscope.analyses.registry.ANALYSES` because they need the model itself, which
the generic contract tests (fake records, no model) cannot give them; their own tests bind tiny models.
"""

from __future__ import annotations

from collections.abc import Collection

from vitscope.analyses.masking_base import ModelAccumulator
from vitscope.analyses.masking_foreground import ForegroundMasking
from vitscope.analyses.masking_frequency import FrequencyFiltering
from vitscope.analyses.masking_interrelation import InterrelationMasking
from vitscope.models.spec import ModelSpec

__all__ = ["MASKING_GROUP", "MODEL_ANALYSES", "masking_analyses"]

MASKING_GROUP = "masking"
MODEL_ANALYSES: dict[str, type[ModelAccumulator]] = {
    cls.name: cls for cls in (InterrelationMasking, ForegroundMasking, FrequencyFiltering)
}


def masking_analyses(name: str, spec: ModelSpec, targets: Collection[str] | None = None) -> list[ModelAccumulator]:
    """Instances for ``name``: one masking analysis, or the ``masking`` group.

    The group keeps what the model and data support (interrelation masking needs a transformer, foreground
    masking needs object masks); a name given alone is returned as is (the CLI then explains what is missing).

    Raises:
        ValueError: the group has no member that can run (e.g. the model has no classifier head).
    """
    if name != MASKING_GROUP:
        return [MODEL_ANALYSES[name]()]
    have = set(targets or ())
    members = [cls() for cls in MODEL_ANALYSES.values()]
    chosen = [a for a in members if a.why_unsupported(spec) is None and set(a.required_targets) <= have]
    if not chosen:
        reasons = [a.why_unsupported(spec) for a in members if a.why_unsupported(spec)]
        need = sorted(set().union(*(a.required_targets for a in members)) - have)
        why = reasons[0] if reasons else f"the data lacks {', '.join(need)}"
        raise ValueError(f"no masking analysis can run: {why}")
    return chosen
