"""Name -> analysis class table, used by the CLI, the engine and the contract tests."""

from __future__ import annotations

import difflib
from collections.abc import Collection
from typing import Any

from vitscope.analyses.activation import MeanActivation
from vitscope.analyses.attention_stats import AttentionStats
from vitscope.analyses.attention_suite import ATTENTION_GROUP, ATTENTION_SUITE, link_attention_plans
from vitscope.analyses.base import Accumulator
from vitscope.analyses.clustering import Clustering
from vitscope.analyses.interrelation import Interrelation
from vitscope.analyses.probe_knn import KnnProbe
from vitscope.analyses.probe_linear import LinearProbe
from vitscope.analyses.representation import BlockCKA
from vitscope.analyses.representation_residual import ResidualCKA
from vitscope.analyses.top_activations import TopActivations
from vitscope.models.spec import ModelSpec

__all__ = ["ANALYSES", "GROUPS", "default_analyses", "get_analysis", "unknown_analysis"]

ANALYSES: dict[str, type[Accumulator]] = {
    MeanActivation.name: MeanActivation,
    AttentionStats.name: AttentionStats,
    **{cls.name: cls for cls in ATTENTION_SUITE},
    **{cls.name: cls for cls in (BlockCKA, ResidualCKA, Clustering, KnnProbe, LinearProbe)},
    TopActivations.name: TopActivations,
    Interrelation.name: Interrelation,
}

#: Group names usable wherever analysis names are listed (``--analyses attention``): group -> members.
GROUPS: dict[str, tuple[str, ...]] = {
    ATTENTION_GROUP: tuple(cls.name for cls in ATTENTION_SUITE),
    "representation": (BlockCKA.name, ResidualCKA.name, Clustering.name),
    "probes": (KnnProbe.name, LinearProbe.name, Clustering.name),
}


def get_analysis(name: str, **kwargs: Any) -> Accumulator:
    """Instantiate the analysis registered as ``name`` with ``kwargs``.

    Raises:
        ValueError: unknown name; the one-line message suggests the closest name and lists all.
    """
    try:
        cls = ANALYSES[name]
    except KeyError:
        raise unknown_analysis(name, ANALYSES, GROUPS) from None
    return cls(**kwargs)


def unknown_analysis(name: str, known: Collection[str], groups: Collection[str]) -> ValueError:
    """The one-line error for an unknown analysis name: the closest known name or group, then all of them."""
    names, group_names = sorted(known), sorted(groups)
    close = difflib.get_close_matches(str(name), names + group_names, n=1, cutoff=0.4)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    listed = f" Groups: {', '.join(group_names)}." if group_names else ""
    return ValueError(f"unknown analysis '{name}'.{hint} Known analyses: {', '.join(names)}.{listed}")


def default_analyses(spec: ModelSpec, targets: Collection[str] | None = None) -> list[Accumulator]:
    """One default-configured instance of every registered analysis that supports ``spec`` and the data.

    Args:
        spec: the model's ModelSpec.
        targets: ground-truth keys the dataset provides (``batch.targets``, e.g. ``{"masks"}``); analyses
            with ``required_targets`` (saliency needs masks) are left out unless all of theirs are here.
            None counts as none.
    """
    have = set(targets or ())
    instances = [cls() for cls in ANALYSES.values() if set(getattr(cls, "required_targets", ())) <= have]
    return link_attention_plans(a for a in instances if a.supports(spec))
