"""vitscope: put vision transformers under a microscope.

Public API: :func:`load_model`, :func:`wrap`, :func:`run` (one pass), :func:`analyze` (one pass with every output
written), :func:`tokens_to_grid`, :class:`Analysis` and :func:`register_analysis` (write your own analysis), the
``analyses``, ``data`` and ``functional`` packages.

Importing the package is cheap: every name is imported on first use (``import torch`` alone takes seconds), so
``vitscope --help`` answers at once.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from vitscope._version import __version__
from vitscope.errors import VitscopeError

#: public name -> (module, attribute), imported on first use
_LAZY: dict[str, tuple[str, str]] = {
    "Analysis": ("vitscope.analyses.base", "Analysis"),
    "Backbone": ("vitscope.models.backbone", "Backbone"),
    "ModelSpec": ("vitscope.models.spec", "ModelSpec"),
    "analyze": ("vitscope.workflows.analyze", "analyze"),
    "compare_models": ("vitscope.workflows.compare", "compare_models"),  # vitscope.compare is the package
    "Result": ("vitscope.analyses.base", "Result"),
    "load_model": ("vitscope.models.load", "load_model"),
    "register_analysis": ("vitscope.analyses.registry", "register_analysis"),
    "run": ("vitscope.engine.run", "run"),
    "tokens_to_grid": ("vitscope.hooks.tokens", "tokens_to_grid"),
    "wrap": ("vitscope.models.wrap", "wrap"),
}

__all__ = ["Analysis", "Backbone", "ModelSpec", "Result", "VitscopeError", "__version__", "analyze",
           "compare_models", "load_model", "register_analysis", "run", "tokens_to_grid", "wrap"]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from vitscope.analyses.base import Analysis, Result
    from vitscope.analyses.registry import register_analysis
    from vitscope.engine.run import run
    from vitscope.hooks.tokens import tokens_to_grid
    from vitscope.models.backbone import Backbone
    from vitscope.models.load import load_model
    from vitscope.models.spec import ModelSpec
    from vitscope.models.wrap import wrap
    from vitscope.workflows.analyze import analyze
    from vitscope.workflows.compare import compare_models


_SUBPACKAGES = ("analyses", "data", "engine", "functional", "hooks", "models")


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"vitscope.{name}")
    if name in _LAZY:
        module, attribute = _LAZY[name]
        value = getattr(importlib.import_module(module), attribute)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'vitscope' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
