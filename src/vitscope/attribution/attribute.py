"""``vitscope.attribution.attribute``: one verb for every attribution method (captum's shape: a method name,
the model, the inputs, the target)."""

from __future__ import annotations

from typing import Any

import torch

from vitscope.attribution.methods import METHODS
from vitscope.attribution.score import score_function
from vitscope.errors import VitscopeRuntimeError, VitscopeTypeError, VitscopeValueError
from vitscope.models.backbone import Backbone

__all__ = ["attribute", "default_methods", "require_method"]

#: the methods ``vitscope attribute`` runs when none is named: a transformer's, a CNN's
DEFAULT_METHODS = {True: ("chefer", "rollout", "token_gradcam"), False: ("gradcam", "input_x_gradient")}


def default_methods(backbone: Backbone) -> list[str]:
    """The methods run when none is named: chefer, rollout and token Grad-CAM on a transformer; Grad-CAM and input x
    gradient on a CNN."""
    return list(DEFAULT_METHODS[backbone.spec.is_transformer])


def require_method(backbone: Backbone, method: str) -> None:
    """Refuse a method that is unknown or that ``backbone`` cannot give.

    Raises:
        VitscopeValueError: an unknown method, a transformer's method on a CNN or a CNN's on a transformer.
    """
    if method not in METHODS:
        raise VitscopeValueError(f"unknown attribution method {method!r}; use one of {', '.join(METHODS)}")
    kind, spec = METHODS[method][1], backbone.spec
    if kind == "transformer" and not spec.is_transformer:
        raise VitscopeValueError(f"method '{method}' reads attention or tokens, but {spec.name} is a CNN; use gradcam, "
                                 "input_x_gradient or integrated_gradients")
    if kind == "cnn" and spec.is_transformer:
        raise VitscopeValueError(f"method '{method}' is for CNNs; for {spec.name} use token_gradcam or chefer")


def attribute(backbone: Backbone, pixels: torch.Tensor, target: Any, method: str, upsample: bool = False,
              pooling: str | None = None, projection: Any = None, **options: Any) -> torch.Tensor:
    """Attribute the model's output on ``pixels`` to its tokens or pixels with ``method``.

    Args:
        backbone: the model (left exactly as found: no ``.grad`` on its parameters, the same modes, kernels and
            hooks).
        pixels: ``[B, 3, H, W]`` preprocessed images (untouched).
        target: for a classifier, an int or ``[B]`` class indices (the score is that class's logit, before the
            softmax); for an embedding model, an embedding ``[D]`` or ``[B, D]`` (the score is the cosine of the
            image's embedding with it).
        method: ``"attention"``, ``"rollout"``, ``"chefer"``, ``"token_gradcam"``, ``"input_x_gradient"``,
            ``"integrated_gradients"`` or (CNNs) ``"gradcam"``.
        upsample: every map bilinearly resized to ``[B, H, W]``.
        pooling: an embedding model's embedding: ``"cls"`` or ``"mean"`` (default: the CLS token when the model
            has one), as retrieval and paired similarity use.
        projection: a metric-learning net's projection of the pooled token (a tensor ``[D, E]`` or a module).
        **options: the method's own (``rollout``: ``discard_ratio``; ``token_gradcam``: ``hook``;
            ``integrated_gradients``: ``baseline``, ``steps``; ``gradcam``: ``stage``).

    Returns:
        float32 ``[B, gh, gw]`` for the token methods (``[B, h, w]`` for ``gradcam``), ``[B, H, W]`` for the pixel
        methods or with ``upsample``; raw, never normalised.

    Raises:
        VitscopeValueError: an unknown method or option, a method the model cannot give (attention of a CNN),
            a class that is not an integer or out of range, an embedding of the wrong width, an integrated
            gradients baseline that is neither a number nor ``[3, H, W]`` / ``[B, 3, H, W]``.
        VitscopeRuntimeError: called inside ``torch.inference_mode`` (no gradient can exist there).
    """
    require_method(backbone, method)
    fn, _ = METHODS[method]
    if not isinstance(pixels, torch.Tensor) or pixels.dim() != 4 or pixels.shape[1] != 3:
        raise VitscopeTypeError(f"pixels must be a [B, 3, H, W] tensor, got {getattr(pixels, 'shape', pixels)}")
    if torch.is_inference_mode_enabled():
        raise VitscopeRuntimeError("attribution needs gradients, which torch.inference_mode forbids; call it outside "
                                   "that context (torch.no_grad around it is fine)")
    import inspect

    allowed = set(inspect.signature(fn).parameters) - {"backbone", "pixels", "score"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise VitscopeValueError(f"method '{method}' has no option {unknown[0]!r}; its options: "
                                 f"{', '.join(sorted(allowed)) or 'none'}")
    x = pixels.detach().to(backbone.device)
    score = score_function(backbone, target, x.shape[0], pooling, projection)
    with torch.enable_grad():
        out = fn(backbone, x, score, **options).float()
    if upsample and out.shape[-2:] != x.shape[-2:]:
        out = torch.nn.functional.interpolate(out[:, None], size=x.shape[-2:], mode="bilinear",
                                              align_corners=False)[:, 0]
    return out
