"""``vitscope.wrap``: adapt a plain ``nn.Module`` and build the tiny models."""

from __future__ import annotations

from typing import Any

from torch import nn

from vitscope.errors import VitscopeTypeError, VitscopeValueError
from vitscope.models.backbone import Backbone
from vitscope.models.cnn import CNNBackbone, CNNLayout, cnn_spec, tiny_resnet_layout
from vitscope.models.timm_layout import TimmLayoutBackbone, check_timm_layout, timm_spec

_TINY_PREPROCESS = {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225), "interpolation": "bicubic",
                    "preprocessing": "built-in (vitscope's tiny models)"}
_PREPROCESSING_FIELDS = ("mean", "std", "image_size", "resize_size", "interpolation", "resize_rule")


def _with_origin(overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` saying that preprocessing fields among them were given to :func:`wrap`."""
    if "preprocessing" in overrides or not any(k in overrides for k in _PREPROCESSING_FIELDS):
        return overrides
    return {**overrides, "preprocessing": "given to vitscope.wrap"}


def wrap(
    module: nn.Module, layout: str | CNNLayout = "auto", name: str | None = None, **spec_overrides: Any
) -> Backbone:
    """Adapt ``module`` to the Backbone interface without copying or changing it (put in eval mode; a ViT-MAE's
    ``config.mask_ratio`` set to 0, so that its forward sees every patch, as :func:`~vitscope.load_model` does).

    Args:
        module: the model.
        layout: ``"auto"``, ``"hf"`` (transformers model), ``"timm"`` (timm VisionTransformer layout),
            ``"tiny-resnet"``, or a :class:`CNNLayout` describing any other CNN.
        name: name stored in the spec (defaults to the class name).
        spec_overrides: ModelSpec fields to set (e.g. ``mean``, ``std``, ``image_size``).

    Raises:
        TypeError: the module does not match the layout; the message names what is missing.
    """
    name = name or type(module).__name__
    module.eval()
    spec_overrides = _with_origin(spec_overrides)
    if isinstance(layout, CNNLayout):
        size = tuple(spec_overrides.pop("image_size", (224, 224)))
        spec = cnn_spec(name, spec_overrides.pop("family", "cnn"), layout.call, layout, size,
                        layout.classifier is not None, **spec_overrides)
        return CNNBackbone(module, spec, layout)
    if layout == "auto":
        layout = _detect(module)
    if layout == "hf":
        from vitscope.models.hf_load import wrap_hf

        if hasattr(module, "vision_model") and hasattr(module, "text_model"):  # its forward needs text too
            raise VitscopeTypeError(f"{name} is an image-text model: wrap its vision tower (model.vision_model), or "
                                    "load the checkpoint with vitscope.load_model, which does")

        return wrap_hf(module, name, overrides=spec_overrides)
    if layout == "timm":
        return TimmLayoutBackbone(module, timm_spec(module, name, **spec_overrides))
    if layout == "tiny-resnet":
        lay = tiny_resnet_layout(module)
        size = (module.config.image_size,) * 2
        spec = cnn_spec(name, "tiny-resnet", lay.call, lay, size, lay.classifier is not None,
                        **{**_TINY_PREPROCESS, "resize_size": size[0], **spec_overrides})
        return CNNBackbone(module, spec, lay)
    raise VitscopeValueError(f"unknown layout '{layout}'; use 'auto', 'hf', 'timm', 'tiny-resnet' or a CNNLayout")


def _detect(module: nn.Module) -> str:
    if hasattr(module, "config") and type(module).__module__.startswith("transformers"):
        return "hf"
    if hasattr(module, "stem") and hasattr(module, "stages") and hasattr(module, "fc"):
        return "tiny-resnet"
    check_timm_layout(module)
    return "timm"


def wrap_tiny_vit(model: nn.Module, name: str | None = None) -> Backbone:
    size = model.config.image_size
    return wrap(model, "timm", name=name or "tiny-vit", family="tiny-vit", resize_size=size, **_TINY_PREPROCESS)


def build_tiny_vit(name: str, num_classes: int = 10, **cfg: Any) -> Backbone:
    """A tiny ViT with random (seeded) weights."""
    from vitscope.models.tiny import TinyViT, TinyViTConfig

    return wrap_tiny_vit(TinyViT(TinyViTConfig(num_classes=num_classes, **cfg)), name=name)


def build_tiny_resnet(name: str, num_classes: int = 10, **cfg: Any) -> Backbone:
    """A tiny ResNet with random (seeded) weights."""
    from vitscope.models.tiny import TinyResNet, TinyResNetConfig

    return wrap(TinyResNet(TinyResNetConfig(num_classes=num_classes, **cfg)), "tiny-resnet", name=name)
