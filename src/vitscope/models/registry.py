"""Registered model names: the tiny models (offline) and hub aliases of the papers' models."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_IMAGENET = {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}
_DINO = {**_IMAGENET, "image_size": (224, 224), "resize_size": 256, "interpolation": "bicubic"}
_DEIT = {**_IMAGENET, "image_size": (224, 224), "resize_size": 256, "interpolation": "bicubic"}
_INCEPTION = {"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "image_size": (224, 224), "resize_size": 224,
              "interpolation": "bilinear"}
_CLIP = {"mean": (0.48145466, 0.4578275, 0.40821073), "std": (0.26862954, 0.26130258, 0.27577711),
         "image_size": (224, 224), "resize_size": 224, "interpolation": "bicubic"}


@dataclass(frozen=True)
class ModelEntry:
    """One registered name.

    Attributes:
        name: what ``load_model`` accepts.
        family: adapter family.
        blocks, heads, width, patch: architecture summary for ``vitscope models``.
        prefix: prefix tokens in canonical order.
        hub_id: Hugging Face hub id (None for built-in models).
        preprocessing: mean/std/size/crop/interpolation the papers used (overrides the checkpoint's).
        builder: zero-argument constructor of a Backbone for built-in models.
        description: one line for ``vitscope models``.
        zoo: a trained tiny-zoo model (its weights must have been built).
    """

    name: str
    family: str
    blocks: int
    heads: int
    width: int
    patch: int
    prefix: tuple[str, ...]
    hub_id: str | None = None
    preprocessing: dict[str, Any] = field(default_factory=dict)
    builder: Callable[[], Any] | None = None
    description: str = ""
    zoo: bool = False




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
    hub = [
        ModelEntry("dino-vits16", "vit", 12, 6, 384, 16, ("cls",), "facebook/dino-vits16", _DINO),
        ModelEntry("dino-vits8", "vit", 12, 6, 384, 8, ("cls",), "facebook/dino-vits8", _DINO),
        ModelEntry("dino-vitb16", "vit", 12, 12, 768, 16, ("cls",), "facebook/dino-vitb16", _DINO),
        ModelEntry("dino-vitb8", "vit", 12, 12, 768, 8, ("cls",), "facebook/dino-vitb8", _DINO),
        ModelEntry("mae-vitb16", "vit_mae", 12, 12, 768, 16, ("cls",), "facebook/vit-mae-base", _DINO),
        ModelEntry("mae-vitl16", "vit_mae", 24, 16, 1024, 16, ("cls",), "facebook/vit-mae-large", _DINO),
        ModelEntry("vit-b16-in21k", "vit", 12, 12, 768, 16, ("cls",), "google/vit-base-patch16-224-in21k",
                   _INCEPTION),
        ModelEntry("vit-b16", "vit", 12, 12, 768, 16, ("cls",), "google/vit-base-patch16-224", _INCEPTION),
        ModelEntry("deit-s16", "deit", 12, 6, 384, 16, ("cls", "dist"),
                   "facebook/deit-small-distilled-patch16-224", _DEIT),
        ModelEntry("deit-b16", "deit", 12, 12, 768, 16, ("cls", "dist"),
                   "facebook/deit-base-distilled-patch16-224", _DEIT),
        ModelEntry("clip-vitb16", "clip", 12, 12, 768, 16, ("cls",), "openai/clip-vit-base-patch16", _CLIP),
        ModelEntry("clip-vitb32", "clip", 12, 12, 768, 32, ("cls",), "openai/clip-vit-base-patch32", _CLIP),
        ModelEntry("siglip-b16", "siglip", 12, 12, 768, 16, (), "google/siglip-base-patch16-224",
                   {**_INCEPTION, "interpolation": "bicubic"}),
        ModelEntry("dinov2-vits14", "dinov2", 12, 6, 384, 14, ("cls",), "facebook/dinov2-small", _DINO),
        ModelEntry("dinov2-vitb14", "dinov2", 12, 12, 768, 14, ("cls",), "facebook/dinov2-base", _DINO),
        ModelEntry("dinov2-vits14-reg", "dinov2_with_registers", 12, 6, 384, 14, ("cls",) + ("reg",) * 4,
                   "facebook/dinov2-with-registers-small", _DINO),
        ModelEntry("beit-b16", "beit", 12, 12, 768, 16, ("cls",), "microsoft/beit-base-patch16-224",
                   {**_INCEPTION, "interpolation": "bicubic"}),
        ModelEntry("resnet50", "resnet", 4, 0, 2048, 32, (), "microsoft/resnet-50",
                   {**_DEIT, "interpolation": "bilinear"}),
        ModelEntry("bit-50", "bit", 4, 0, 2048, 32, (), "google/bit-50", {**_INCEPTION, "resize_size": 256}),
        ModelEntry("convnext-tiny", "convnext", 4, 0, 768, 32, (), "facebook/convnext-tiny-224", _DEIT),
    ]
    return tiny + _zoo_entries() + hub


def _zoo_entries() -> list[ModelEntry]:
    """The trained tiny zoo (weights shipped in the package) and its shipped training checkpoints."""
    from vitscope.zoo.catalog import ZOO
    from vitscope.zoo.store import load_zoo_model

    out = []
    for e in ZOO:
        m = e.model
        vit = e.arch == "tiny-vit"
        widths = tuple(m.get("widths", (32, 64, 128, 256)))
        shape = (len(widths), 0, widths[-1], 16, ())  # the tiny ResNet: its stages, last width, stride 16
        if vit:
            shape = (m.get("depth", 6), m.get("num_heads", 4), m.get("embed_dim", 128), m.get("patch_size", 8),
                     ("cls",) + ("reg",) * m.get("num_reg_tokens", 0))
        steps = (0, *e.snapshot_steps) if e.snapshot_steps else ()
        names = [e.name] + [f"{e.name}@step{s}" for s in steps]
        for n in names:
            what = e.description if n == e.name else f"{e.name} after {n.split('@step')[1]} training steps"
            out.append(ModelEntry(n, e.arch, *shape, builder=lambda n=n: load_zoo_model(n), zoo=True,
                                  description=f"zoo: {what}"))
    return out


_REGISTRY: dict[str, ModelEntry] | None = None


def registry() -> dict[str, ModelEntry]:
    """Name -> entry for every registered model (built lazily)."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = {e.name: e for e in _entries()}
    return _REGISTRY


def register(entry: ModelEntry) -> None:
    """Add a model name (later issues register the trained zoo this way)."""
    registry()[entry.name] = entry
