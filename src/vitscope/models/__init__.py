"""Models: load a model by name (:func:`load_model`), the :class:`Backbone` every adapter gives, its
:class:`ModelSpec`, and the registries other code adds to (model names, Hugging Face families).

``vitscope.wrap`` wraps a module of your own (``vitscope.models.wrap`` is the module that defines it). Names are
imported on first use, so the command line reads ``vitscope.models.errors`` without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vitscope._lazy import lazy_exports

__all__ = ["Backbone", "HFFamily", "ModelEntry", "ModelLoadError", "ModelSpec",
           "UnknownModelError", "load_model", "register_family", "register_model"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "Backbone": "vitscope.models.backbone",
    "HFFamily": "vitscope.models.family",
    "ModelEntry": "vitscope.models.entry",
    "ModelLoadError": "vitscope.models.errors",
    "ModelSpec": "vitscope.models.spec",
    "UnknownModelError": "vitscope.models.load",
    "load_model": "vitscope.models.load",
    "register_family": "vitscope.models.family",
    "register_model": "vitscope.models.registry",
})

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from vitscope.models.backbone import Backbone
    from vitscope.models.entry import ModelEntry
    from vitscope.models.errors import ModelLoadError
    from vitscope.models.family import HFFamily, register_family
    from vitscope.models.load import UnknownModelError, load_model
    from vitscope.models.registry import register_model
    from vitscope.models.spec import ModelSpec
