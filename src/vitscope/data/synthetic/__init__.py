"""Procedural synthetic world: part-based objects on textured backgrounds with full ground truth."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vitscope.data.synthetic.render import ObjectSpec
from vitscope.data.synthetic.scene import ClassSpec, Scene, SceneObject

if TYPE_CHECKING:
    from vitscope.data.synthetic.world import SyntheticWorld

__all__ = ["ClassSpec", "ObjectSpec", "Scene", "SceneObject", "SyntheticWorld"]


def __getattr__(name: str) -> Any:
    # Imported lazily so that ``python -m vitscope.data.synthetic.world`` runs without a runpy warning.
    if name == "SyntheticWorld":
        from vitscope.data.synthetic.world import SyntheticWorld

        return SyntheticWorld
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
