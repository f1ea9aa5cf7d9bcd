"""Registered model names: the tiny models (offline), the zoo, and hub aliases of the papers' models."""

from __future__ import annotations

from vitscope.models.entry import ModelEntry

__all__ = ["ENTRY_POINT_GROUP", "ModelEntry", "register_model", "registry"]


def _entries() -> list[ModelEntry]:
    from vitscope.models.wrap import build_tiny_resnet, build_tiny_vit

    tiny = [
        ModelEntry("tiny-vit", "tiny-vit", 6, 4, 128, 8, ("cls",), builder=lambda: build_tiny_vit("tiny-vit"),
                   description="vitscope's tiny ViT (64 px, patch 8), random weights, 10-class head"),
        ModelEntry("tiny-vit-reg", "tiny-vit", 6, 4, 128, 8, ("cls", "reg", "reg"),
                   builder=lambda: build_tiny_vit("tiny-vit-reg", num_reg_tokens=2),
                   description="tiny ViT with 2 register tokens"),
        ModelEntry("tiny-vit-p16", "tiny-vit", 6, 4, 128, 16, ("cls",),
                   builder=lambda: build_tiny_vit("tiny-vit-p16", patch_size=16),
                   description="tiny ViT with 16 px patches (4x4 tokens)"),
        ModelEntry("tiny-resnet", "tiny-resnet", 4, 0, 256, 16, (), builder=lambda: build_tiny_resnet("tiny-resnet"),
                   description="vitscope's tiny ResNet (64 px), random weights, 10-class head"),
    ]
    from vitscope.models.families import hf_families  # each family's file lists its checkpoints' aliases

    hub = [alias for family in hf_families().values() for alias in family.aliases]
    return tiny + _plugin_entries() + hub


#: entry-point group through which other packages (and vitscope's own zoo) add model names: each entry point
#: is a zero-argument callable returning a list of :class:`ModelEntry`
ENTRY_POINT_GROUP = "vitscope.models"


def _plugin_entries() -> list[ModelEntry]:
    """Model names registered by packages through the ``vitscope.models`` entry points (the zoo is one)."""
    from importlib.metadata import entry_points

    out: list[ModelEntry] = []
    for point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name):
        out.extend(point.load()())
    return out


_REGISTRY: dict[str, ModelEntry] | None = None


def registry() -> dict[str, ModelEntry]:
    """Name -> entry for every registered model (built lazily)."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = {e.name: e for e in _entries()}
    return _REGISTRY


def register_model(entry: ModelEntry) -> None:
    """Add a model name at run time (packages add theirs through the ``vitscope.models`` entry points)."""
    registry()[entry.name] = entry
