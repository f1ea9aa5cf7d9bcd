"""Hugging Face model families as descriptors: one file per family under :mod:`vitscope.models.families`.

A descriptor says everything family-specific the adapters need (timm's one-file-per-family, as data): how to
load the checkpoint, its prefix tokens, its preprocessing defaults, how its classifier pools the tokens, and
extra arguments its forward or its blocks take. The adapters (:mod:`vitscope.models.hf`,
:mod:`vitscope.models.hf_load`, :mod:`vitscope.models.hf_spec`) read descriptors and never branch on family
names. Registered aliases of the papers' checkpoints (``dino-vitb16``...) live in the family's file too.

Adding a family: one file that calls :func:`register_family`, imported by ``families/__init__.py`` (which also
looks families up: :func:`vitscope.models.families.get_family`), plus a test factory
(``tests/helpers/hf_factories.py``); see ``docs/extending.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vitscope.errors import VitscopeValueError
from vitscope.models.layout_names import HFLayout

if TYPE_CHECKING:  # annotations only
    import torch
    from torch import nn

    from vitscope.models.entry import ModelEntry

__all__ = ["HFFamily", "IMAGENET", "family_of", "load_auto", "register_family", "registered_families"]

IMAGENET: Mapping[str, Any] = {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225), "interpolation": "bicubic"}


def _cls_prefix(config: Any) -> tuple[str, ...]:
    return ("cls",)


def _cls_head(backbone: Any, tokens: torch.Tensor) -> torch.Tensor:
    return backbone.model.classifier(tokens[:, 0])


def _no_kwargs(backbone: Any, fn: Any, pixels: torch.Tensor) -> dict[str, Any]:
    return {}


def _plain_layers(backbone: Any, tokens: torch.Tensor) -> dict[str, Any]:
    return {"attention_mask": None}


def _nothing_to_prepare(model: nn.Module) -> None:
    return None


def _same_pixels(backbone: Any, pixels: torch.Tensor) -> torch.Tensor:
    return pixels


def _config_size(config: Any) -> tuple[int, int]:
    size = config.image_size
    return (size, size) if isinstance(size, int) else tuple(size)


def _no_budget(config: Any) -> int | None:
    return None


def load_auto(source: str, config: Any, **hub: Any) -> nn.Module:
    """The checkpoint's own classifier class when its architectures name one, else ``AutoModel``."""
    import transformers as tf

    from vitscope.models.hf_pretrained import from_pretrained

    archs = config.architectures or []
    if any(a.endswith("ForImageClassification") or a.endswith("WithTeacher") for a in archs):
        cls = getattr(tf, archs[0], None) or tf.AutoModelForImageClassification
        return from_pretrained(cls, source, **hub)
    return from_pretrained(tf.AutoModel, source, **hub)


@dataclass(frozen=True)
class HFFamily:
    """What is particular to one Hugging Face model family.

    Attributes:
        name: the family, ``config.model_type`` without ``_vision_model`` (``clip_vision_model`` -> ``clip``).
        kind: ``"transformer"`` or ``"cnn"``.
        preprocessing: mean, std and interpolation used when a checkpoint ships no ``preprocessor_config.json``.
        prefix: ``config -> prefix token kinds`` in canonical order (CLS, distillation, registers).
        load: ``(source, config, **hub) -> model`` (e.g. CLIP loads its vision tower only).
        prepare: ``model -> None``: what a loaded or wrapped model must be set to for its forward to see the whole
            image, the same way every time (ViT-MAE: ``config.mask_ratio`` 0, nothing masked).
        head: ``(backbone, tokens [B, N, D]) -> logits``: the pooling of the family's classifier.
        head_after_final_norm: the classifier reads final-normed tokens (CLIP pools before the norm).
        forward_kwargs: ``(backbone, fn, pixels) -> extra keyword arguments`` of the model's and the
            embeddings' forward (ViT-MAE: a fixed patch order).
        layer_kwargs: ``(backbone, tokens) -> keyword arguments`` of every block's forward (BEiT's bias).
        positions_in_blocks: the blocks receive the tokens' positions (rotary embeddings) through ``layer_kwargs``,
            which then takes ``positions`` (``[B, K]`` kept spatial tokens, or None for the whole grid).
        kept_layers: for a family whose blocks add a bias between token places (BEiT), ``(backbone, tokens,
            positions [B, K]) -> a context`` under which every block takes that bias at the kept tokens' places;
            ``layer_kwargs`` then takes ``positions`` too. None: the blocks run any subset as it is.
        resizable: ``config -> bool``: the model takes other input sizes than its config's (its position
            embeddings are interpolated or computed for any grid).
        layout: where the blocks, norms, attention, MLP, layer scale and final norm live (the ViT names by
            default).
        pixel_values: ``(backbone, pixels [B, 3, H, W]) -> what the model's and the embeddings' forward take as
            pixels`` (SigLIP 2 NaFlex: patchified ``[B, h*w, 3*p*p]``; default: the pixels).
        input_size: ``config -> (H, W)`` the model was built for (default ``config.image_size``).
        token_budget: ``config -> the most patches per image`` for a family whose images keep their aspect ratio
            (SigLIP 2 NaFlex; a checkpoint's ``max_num_patches`` overrides it), None for the others.
        aliases: registered names of the papers' checkpoints of this family.
    """

    name: str
    kind: str = "transformer"
    preprocessing: Mapping[str, Any] = field(default_factory=lambda: dict(IMAGENET))
    prefix: Callable[[Any], tuple[str, ...]] = _cls_prefix
    load: Callable[..., nn.Module] = load_auto
    prepare: Callable[[nn.Module], None] = _nothing_to_prepare
    head: Callable[[Any, torch.Tensor], torch.Tensor] = _cls_head
    head_after_final_norm: bool = True
    forward_kwargs: Callable[[Any, Any, torch.Tensor], dict[str, Any]] = _no_kwargs
    layer_kwargs: Callable[[Any, torch.Tensor], dict[str, Any]] = _plain_layers
    positions_in_blocks: bool = False
    kept_layers: Callable[[Any, torch.Tensor, torch.Tensor], AbstractContextManager[Any]] | None = None
    resizable: Callable[[Any], bool] = lambda config: True
    layout: HFLayout = HFLayout()
    pixel_values: Callable[[Any, torch.Tensor], torch.Tensor] = _same_pixels
    input_size: Callable[[Any], tuple[int, int]] = _config_size
    token_budget: Callable[[Any], int | None] = _no_budget
    aliases: tuple[ModelEntry, ...] = ()


_FAMILIES: dict[str, HFFamily] = {}


def register_family(family: HFFamily) -> HFFamily:
    """Make ``family`` known to the Hugging Face adapters (called by its file in ``models/families``)."""
    if family.kind not in ("transformer", "cnn"):
        raise VitscopeValueError(f"family {family.name!r}: kind must be 'transformer' or 'cnn', got {family.kind!r}")
    _FAMILIES[family.name] = family
    return family


def family_of(config: Any) -> str:
    """Adapter family from a transformers config (``clip_vision_model`` -> ``clip``)."""
    return config.model_type.removesuffix("_vision_model")


def registered_families() -> dict[str, HFFamily]:
    """The families registered so far (:func:`vitscope.models.families.hf_families` imports the built-in ones)."""
    return dict(_FAMILIES)
