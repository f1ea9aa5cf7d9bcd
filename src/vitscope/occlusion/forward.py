"""Run a model on masked inputs: pixel filling or token dropping (staged execution)."""

from __future__ import annotations

import torch

from vitscope.errors import VitscopeValueError
from vitscope.functional.occlusion import fill_pixels, patch_to_pixel_mask
from vitscope.models.backbone import Backbone
from vitscope.models.outputs import head_logits, logits_of

__all__ = ["MODES", "drop_tokens_logits", "logits_of", "masked_logits"]

MODES: tuple[str, ...] = ("pixel", "drop")


def drop_tokens_logits(backbone: Backbone, pixels: torch.Tensor, patch_mask: torch.Tensor) -> torch.Tensor:
    """Logits with the masked patch tokens removed from the sequence after the embedding.

    Prefix tokens are always kept; a model without them (a mean-pooling head) needs one patch kept per image.
    The kept spatial tokens keep their positions (position embeddings added by
    ``embed``, or, for rotary embeddings inside the blocks, each kept token's own rotation:
    :meth:`~vitscope.models.backbone.Backbone.run_kept`). Images with the same number of kept tokens run together.

    Args:
        backbone: a transformer with a classifier head.
        pixels: ``[B, 3, H, W]`` normalised input.
        patch_mask: ``[B, h, w]`` bool, True = drop that token.

    Returns:
        ``[B, classes]`` logits.

    Raises:
        VitscopeValueError: a CNN; a mask of another grid; or an image left with no token at all (every patch
            dropped and no prefix token).
    """
    spec = backbone.spec
    if not spec.is_transformer:
        raise VitscopeValueError(f"token dropping needs a transformer, but {spec.name} is a CNN; use mode='pixel'")
    tokens = backbone.embed(pixels)
    p = spec.num_prefix_tokens
    keep = ~patch_mask.reshape(len(pixels), -1).to(tokens.device)
    if keep.shape[1] != tokens.shape[1] - p:
        raise VitscopeValueError(f"the mask has {keep.shape[1]} patches but the model sees {tokens.shape[1] - p} "
                                 "tokens")
    out: torch.Tensor | None = None
    sizes = keep.sum(dim=1)
    kept = sizes.unique().tolist()
    if p == 0 and 0 in kept:  # an empty sequence: the model would fail inside its attention
        raise VitscopeValueError(f"token dropping would leave {spec.name} no token: the mask drops every patch of an "
                                 "image and the model has no prefix token (CLS) to keep; mask fewer patches or use "
                                 "mode='pixel'")
    for size in kept:
        rows = (sizes == size).nonzero().flatten()
        ids = keep[rows].nonzero()[:, 1].reshape(len(rows), int(size))  # ascending positions per row
        spatial = torch.gather(tokens[rows, p:], 1, ids.unsqueeze(-1).expand(-1, -1, tokens.shape[-1]))
        seq = torch.cat([tokens[rows, :p], spatial], dim=1)
        logits = head_logits(backbone, backbone.run_kept(seq, ids, 0, spec.num_blocks))
        if out is None:
            out = logits.new_empty(len(pixels), *logits.shape[1:])
        out[rows] = logits
    assert out is not None
    return out


def masked_logits(
    backbone: Backbone, pixels: torch.Tensor, patch_mask: torch.Tensor | None = None, mode: str = "pixel",
    fill: str = "mean", blur_sigma: float = 4.0, pixel_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logits of ``backbone`` on ``pixels`` with a mask applied.

    Args:
        backbone: any classifier backbone (``mode="drop"``: a transformer).
        pixels: ``[B, 3, H, W]`` normalised input.
        patch_mask: ``[B, h, w]`` bool on the token grid, True = hidden.
        mode: ``"pixel"`` (fill the hidden pixels) or ``"drop"`` (remove the hidden tokens).
        fill, blur_sigma: pixel filling (:func:`~vitscope.functional.fill_pixels`).
        pixel_mask: ``[B, H, W]`` bool pixel mask instead of ``patch_mask`` (pixel mode only).

    Returns:
        ``[B, classes]`` logits; an all-False mask gives exactly the unmasked logits.
    """
    if mode not in MODES:
        raise VitscopeValueError(f"mode must be one of {MODES}, got {mode!r}")
    if (patch_mask is None) == (pixel_mask is None):
        raise VitscopeValueError("pass exactly one of patch_mask and pixel_mask")
    if mode == "drop":
        if patch_mask is None:
            raise VitscopeValueError("token dropping needs a patch mask on the token grid, not a pixel mask")
        return drop_tokens_logits(backbone, pixels, patch_mask)
    if pixel_mask is None:
        pixel_mask = patch_to_pixel_mask(patch_mask.to(pixels.device), pixels.shape[-2:])
    spec = backbone.spec
    x = fill_pixels(pixels, pixel_mask.to(pixels.device), fill, spec.mean, spec.std, blur_sigma)
    return logits_of(backbone(x))
