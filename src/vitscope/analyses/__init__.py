"""Mergeable streaming analyses (docs/architecture.md), their registry, parameters and result types.

Each analysis is one file in a sub-package by family (``attention``, ``representation``, ``activations``,
``probes``, ``masking``, ``interventions``, ``diagnostics``) and registers itself where it is defined
(``@register_analysis``); the registry's first read imports every module of this package (:mod:`.plugins`), so no
list names them. Importing this package is
cheap: its names are imported on first use, so that ``vitscope analyze --help`` lists the analyses from their
source without importing torch (:mod:`.catalog`). Besides the names below, every class a built-in analysis's
module exports is importable from here by its name (the analysis and its Result: ``KnnProbe``,
``AttentionStatsResult``). The cached-feature entry points (k-NN, linear probe, clustering, cross-model CKA) are
functions beside their analyses. The probes that need a whole benchmark at once (revisited retrieval, DAVIS
propagation, SPair keypoints) extract features through the engine and live one floor up, in
:mod:`vitscope.downstream`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any

#: public name -> module that defines it, imported on first use
_LAZY: dict[str, str] = {
    **dict.fromkeys(("ANALYSES", "GROUPS", "default_analyses", "get_analysis", "register_analysis"), "registry"),
    **dict.fromkeys(("Analysis", "Batch", "Result"), "base"),
    "attention_suite": "attention.suite",
    **dict.fromkeys(("ProbeResult", "best_block_table"), "probes.result"),
    **dict.fromkeys(("cka_between", "cross_model_cka"), "representation.cka"),
    "clustering_probe": "probes.clustering",
    "knn_probe": "probes.knn",
    "linear_probe": "probes.linear",
}


def _exported_classes() -> dict[str, type]:
    """Every class the module of a built-in analysis exports (``__all__``), by name."""
    from vitscope.analyses.registry import ANALYSES

    found: dict[str, type] = {}
    for cls in ANALYSES.values():
        if cls.__module__.startswith(f"{__name__}."):
            module = sys.modules[cls.__module__]
            for name in getattr(module, "__all__", ()):
                value = getattr(module, name, None)
                if isinstance(value, type):
                    found.setdefault(name, value)
    return found


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    elif name == "__all__":
        value = sorted({*_LAZY, *_exported_classes()})
    elif name[:1].isupper() and name in (classes := _exported_classes()):
        value = classes[name]
    elif name.isidentifier() and name[:1].islower() and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")  # a submodule, as before any import named it
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
