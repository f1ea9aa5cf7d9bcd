"""Package facades that import on first use: ``import vitscope`` and ``vitscope --help`` stay free of torch.

A facade's ``__init__`` names its public attributes and the module of each; :func:`lazy_exports` gives it the
``__getattr__`` that imports one when it is first read, and the ``__dir__`` that shows the public surface only.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Collection, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str], submodules: Collection[str] = ()
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for the package ``package`` (its ``__name__``).

    Args:
        package: the facade's module name.
        exports: public name -> the module defining it under that name (imported when the name is first read).
        submodules: public submodules, listed by ``dir()`` and imported when first read as attributes.

    ``dir()`` then lists the package's ``__all__``, the submodules and the module's dunder attributes: no
    helper it imported (``TYPE_CHECKING``, ``importlib``...) and no private name.
    """
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        if name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
            namespace[name] = value  # later reads skip this function
            return value
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        dunders = {name for name in namespace if name.startswith("__") and name.endswith("__")}
        return sorted(set(namespace.get("__all__", ())) | set(submodules) | dunders)

    return __getattr__, __dir__
