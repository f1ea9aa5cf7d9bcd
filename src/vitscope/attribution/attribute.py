"""``vitscope.attribution.attribute``: one verb for every attribution method (captum's shape: a method name,
the model, the inputs, the target)."""

from __future__ import annotations

from typing import Any

import torch

from vitscope.attribution.methods import METHODS
from vitscope.attribution.score import score_function
from vitscope.errors import VitscopeRuntimeError, VitscopeTypeError, VitscopeValueError
from vitscope.models.backbone import Backbone

__all__ = ["attribute"]


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
    if method not in METHODS:
        raise VitscopeValueError(f"unknown attribution method {method!r}; use one of {', '.join(METHODS)}")
    fn, kind = METHODS[method]
    spec = backbone.spec
    if kind == "transformer" and not spec.is_transformer:
        raise VitscopeValueError(f"method '{method}' reads attention or tokens, but {spec.name} is a CNN; use gradcam, "
                                 "input_x_gradient or integrated_gradients")
    if kind == "cnn" and spec.is_transformer:
        raise VitscopeValueError(f"method '{method}' is for CNNs; for {spec.name} use token_gradcam or chefer")
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
