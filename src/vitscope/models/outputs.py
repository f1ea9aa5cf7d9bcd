"""What a model returns, read the same way everywhere: the logits of a classifier's output, the embedding of a
model without one, and the readout of either from a block's tokens."""

from __future__ import annotations

from typing import Any

import torch

from vitscope.errors import VitscopeTypeError, VitscopeValueError

__all__ = ["edited_readout", "embedding_hook", "embedding_of", "embedding_pooling", "head_logits", "logits_of",
           "output_change", "readout"]


def logits_of(output: Any) -> torch.Tensor:
    """The logits tensor of a model's own output (a tensor, or an object with ``.logits`` as in transformers)."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    raise VitscopeTypeError(f"cannot find logits in a model output of type {type(output).__name__}")


def embedding_pooling(spec: Any) -> str:
    """How a model without a classifier pools its embedding by default: its CLS token, else the mean of its
    spatial tokens (SigLIP, I-JEPA, AIMv2)."""
    return "cls" if spec.has_cls_token else "mean"


def embedding_hook(spec: Any) -> str:
    """The recorded hook an embedding is read from (:func:`embedding_of`): a transformer's final-normed tokens
    (``"final_norm"``), a CNN's last feature map (``"features"``)."""
    return "final_norm" if spec.is_transformer else "features"


def embedding_of(backbone: Any, tokens: torch.Tensor, pooling: str,
                 projection: torch.Tensor | torch.nn.Module | None = None) -> torch.Tensor:
    """The embedding of final-normed ``tokens [B, N, D]``: the CLS token (``"cls"``) or the mean of the spatial
    tokens (``"mean"``), projected when a projection is given (a metric-learning net's head): ``[B, E]``.

    A CNN's feature map ``[B, C, h, w]`` (:func:`embedding_hook`) is pooled by the mean over its positions, then
    the LayerNorm the model applies to that mean where it has one (ConvNeXt's ``pooled_norm``), as the model and
    paired similarity pool it.
    """
    if tokens.dim() == 4:
        if pooling != "mean":
            raise VitscopeValueError(f"a CNN's feature map is pooled by its mean, not {pooling!r}")
        pooled = tokens.flatten(2).mean(dim=-1)
        norm = getattr(backbone, "pooled_norm", None)
        pooled = pooled if norm is None else norm(pooled)
    else:
        pooled = tokens[:, 0] if pooling == "cls" else tokens[:, backbone.spec.num_prefix_tokens:].mean(dim=1)
    if projection is None:
        return pooled
    return projection(pooled) if isinstance(projection, torch.nn.Module) else pooled @ projection


def head_logits(backbone: Any, tokens: torch.Tensor) -> torch.Tensor:
    """A classifier's logits from the last block's ``tokens``, its final norm applied as the model applies it."""
    return backbone.head(backbone.final_norm(tokens) if backbone.head_after_final_norm else tokens)


def tokens_the_head_reads(backbone: Any, tokens: torch.Tensor) -> torch.Tensor:
    """Which of a block's ``tokens [B, N, D]`` a classifier's logits depend on: ``[N]`` bool, the tokens whose
    gradient through :func:`head_logits` is not zero (no parameter's gradient is kept)."""
    tokens = tokens.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        (grad,) = torch.autograd.grad(head_logits(backbone, tokens).float().sum(), tokens)
    return grad.abs().sum(dim=(0, 2)) > 0


def readout(backbone: Any, tokens: torch.Tensor) -> torch.Tensor:
    """The model's output read from a block's ``tokens [B, N, D]``: a classifier's logits ``[B, C]``, else the
    default embedding of the final-normed tokens ``[B, D]`` (:func:`embedding_pooling`); float32."""
    if backbone.spec.has_head:
        return head_logits(backbone, tokens).float()
    return embedding_of(backbone, backbone.final_norm(tokens), embedding_pooling(backbone.spec)).float()


def edited_readout(backbone: Any, pixels: torch.Tensor, edits: Any = None) -> torch.Tensor:
    """The model's :func:`readout` of ``pixels`` under ``edits`` (a ``{hook: fn}`` mapping for
    ``backbone.intervene``; None: the model as it is): ``[n, C]`` float32 on the CPU. A CNN's is read from its
    ``features`` map (its classifier's logits, else the map's mean), so that an edit of any stage reaches it."""
    import contextlib

    cnn = not backbone.spec.is_transformer
    last = "features" if cnn else f"blocks.{backbone.spec.num_blocks - 1}.resid_post"
    edit = backbone.intervene(dict(edits)) if edits else contextlib.nullcontext()
    with torch.no_grad(), edit, backbone.record([last]) as rec:
        backbone(pixels.to(backbone.device))
        if not cnn:
            return readout(backbone, rec[last]).float().cpu()
        features = rec[last]  # already past the final norm: the head pools and classifies it
        found = backbone.head(features) if backbone.spec.has_head else embedding_of(backbone, features, "mean")
        return found.float().cpu()


def output_change(backbone: Any, clean: torch.Tensor, edited: torch.Tensor) -> dict[str, float]:
    """How far an edit moved the output: for a classifier the share of images whose top class stays
    (``top1_kept``) and the mean KL divergence ``KL(clean || edited)`` of the class distributions (``output_kl``,
    nats); for an embedding model the mean cosine of the edited embedding to the clean one (``output_cosine``).

    The KL divergence is summed in float64 from float64 log-probabilities, each image's clamped at 0: an edit that
    barely moves the logits (a control that puts back nearly the same tokens: KL about 1e-8) is read as it is,
    where a float32 sum's rounding is as large and of either sign.

    Args:
        clean, edited: :func:`readout` of the same images ``[n, C]``.
    """
    if backbone.spec.classifies:  # a metric net's head gives an embedding: compared by cosine
        p, q = clean.double().log_softmax(dim=-1), edited.double().log_softmax(dim=-1)
        kl = (p.exp() * (p - q)).sum(dim=-1).clamp_min(0.0)  # [n]; >= 0 but for the sum's rounding
        return {"top1_kept": float((clean.argmax(-1) == edited.argmax(-1)).double().mean()),
                "output_kl": float(kl.mean())}
    return {"output_cosine": float(torch.nn.functional.cosine_similarity(clean, edited, dim=-1).mean())}
