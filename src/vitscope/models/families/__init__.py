"""One descriptor file per Hugging Face family (:class:`vitscope.models.family.HFFamily`); importing this
package registers them all, and it is where the adapters look a family up."""

from __future__ import annotations

from vitscope.errors import VitscopeKeyError
from vitscope.models.families import (  # noqa: F401  (each file registers its family)
    beit,
    bit,
    clip,
    convnext,
    deit,
    dinov2,
    dinov2_with_registers,
    resnet,
    siglip,
    vit,
    vit_mae,
)
from vitscope.models.family import HFFamily, registered_families

__all__ = ["get_family", "hf_families"]


def hf_families() -> dict[str, HFFamily]:
    """Every registered family by name."""
    return registered_families()


def get_family(name: str) -> HFFamily:
    """The descriptor of family ``name``.

    Raises:
        KeyError: an unsupported family (the message lists the supported ones).
    """
    families = registered_families()
    if name not in families:
        raise VitscopeKeyError(f"model type '{name}' is not supported; supported: {', '.join(sorted(families))}")
    return families[name]
