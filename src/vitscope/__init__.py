"""vitscope: put vision transformers under a microscope.

Public API (docs/api.md lists it whole): :func:`load_model`, :func:`wrap`, :func:`run` (one pass), :func:`analyze`
(one pass with every output written), :func:`compare_models`, :func:`tokens_to_grid`, :class:`Analysis` and
:func:`register_analysis` (write your own analysis), and the packages ``analyses``, ``data``, ``engine``,
``hooks``, ``models``, ``functional``...

Importing the package is cheap: every name is imported on first use (``import torch`` alone takes seconds), so
``vitscope --help`` answers at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vitscope._lazy import lazy_exports
from vitscope._version import __version__
from vitscope.errors import VitscopeError

__all__ = ["Analysis", "Backbone", "ModelSpec", "Result", "VitscopeError", "__version__", "analyze",
           "compare_models", "load_model", "register_analysis", "run", "tokens_to_grid", "wrap"]

#: the packages a user imports from (docs/api.md); the others are the command line's and the writer's rooms
_SUBPACKAGES = ("analyses", "attribution", "cache", "data", "engine", "errors", "explain", "featviz", "functional",
               "hooks", "interventions", "models", "occlusion", "outputs", "sae", "train", "viz", "zoo")

__getattr__, __dir__ = lazy_exports(__name__, {
    "Analysis": "vitscope.analyses.base",
    "Backbone": "vitscope.models.backbone",
    "ModelSpec": "vitscope.models.spec",
    "Result": "vitscope.analyses.base",
    "analyze": "vitscope.workflows.analyze",
    "compare_models": "vitscope.workflows.compare",  # vitscope.comparison is the package of its pieces
    "load_model": "vitscope.models.load",
    "register_analysis": "vitscope.analyses.registry",
    "run": "vitscope.engine.run",
    "tokens_to_grid": "vitscope.hooks.tokens",
    "wrap": "vitscope.models.wrap",
}, _SUBPACKAGES)

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
