"""Decompose a CLS-pooled embedding over the spatial tokens entering the last block.

The last block's CLS output before the final norm is ``h = x_cls + ls(W_o u + b_o) + mlp_out`` with
``u = concat_h sum_x A_h[cls, x] v_h[x]``. The value path of spatial token x,
``c_x = ls(W_o u_x)`` with ``u_x = concat_h A_h[cls, x] v_h[x]``, is linear in ``u_x``; so is the final
LayerNorm once its per-token statistics are frozen at their actual values (``mean`` is linear, ``sigma``
a scalar of this input), and so is the projection. The embedding is therefore exactly
``e = sum_x P(ln_lin(c_x)) + rest``, where ``rest`` gathers the CLS token's own stream, the prefix tokens'
values, the MLP, every bias and the norm's shift. Only adapters whose attention output projection and final
LayerNorm can be located are supported (timm-layout models and Hugging Face ViT-family models).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vitscope.errors import VitscopeValueError
from vitscope.functional.similarity import frozen_layer_norm, project_tokens
from vitscope.models.backbone import Backbone

__all__ = ["ClsParts", "cls_parts"]

_OUT_PROJ_PATHS = ("attn.proj", "attention.output.dense", "self_attn.out_proj", "attention.o_proj")


@dataclass
class ClsParts:
    """A CLS embedding split over the tokens entering the last block.

    Attributes:
        parts: ``[B, K, E]`` value-path parts of the spatial tokens.
        rest: ``[B, E]`` everything else (``parts.sum(1) + rest`` is the embedding).
        cls_attention: ``[B, K]`` the last block's CLS attention over spatial tokens, heads averaged.
        patterns: every block's ``[B, H, N, N]`` attention pattern, first block first.
    """

    parts: torch.Tensor
    rest: torch.Tensor
    cls_attention: torch.Tensor
    patterns: list[torch.Tensor]


def _get(module: nn.Module, path: str) -> Any:
    for part in path.split("."):
        module = getattr(module, part, None)
        if module is None:
            return None
    return module


def _last_block_pieces(backbone: Backbone) -> tuple[nn.Linear, Any, nn.LayerNorm]:
    blocks = getattr(backbone, "blocks", None)
    norm = getattr(backbone, "_final_norm", None) or getattr(backbone.model, "norm", None)
    if not blocks or not isinstance(norm, nn.LayerNorm):
        raise VitscopeValueError("pooling='cls' needs a timm-layout or Hugging Face ViT backbone with a final "
                                 f"LayerNorm; {backbone.spec.name} is not supported (use pooling='mean')")
    last = blocks[-1]
    proj = next((m for m in (_get(last.layer, p) for p in _OUT_PROJ_PATHS) if isinstance(m, nn.Linear)), None)
    if proj is None:
        raise VitscopeValueError(f"cannot find the attention output projection of {backbone.spec.name}'s last block")
    attn_module = _get(last.layer, "attn") or _get(last.layer, "attention") or _get(last.layer, "self_attn")
    scale_module = last.attn_end if last.attn_end is not attn_module else None  # LayerScale modules (linear)

    def scale(x: torch.Tensor) -> torch.Tensor:
        if last.attn_scale is not None:
            x = x * last.attn_scale
        return scale_module(x) if scale_module is not None else x

    return proj, scale, norm


@torch.no_grad()
def cls_parts(backbone: Backbone, pixels: torch.Tensor, projection: Any = None) -> ClsParts:
    """Run the model once and split its (projected) CLS embedding over the spatial tokens.

    Args:
        backbone: a transformer with a CLS token at prefix position 0.
        pixels: ``[B, 3, H, W]`` preprocessed images.
        projection: see :func:`vitscope.functional.project_tokens`.

    Returns:
        :class:`ClsParts`; ``parts.sum(1) + rest`` equals the projected final-norm CLS token exactly.
    """
    spec = backbone.spec
    if not spec.prefix_kinds or spec.prefix_kinds[0] != "cls":
        raise VitscopeValueError(f"{spec.name} has no CLS token at position 0; use pooling='mean'")
    proj, scale, norm = _last_block_pieces(backbone)
    last, p = spec.num_blocks - 1, spec.num_prefix_tokens
    names = [f"blocks.{i}.attn.pattern" for i in range(spec.num_blocks)] + [f"blocks.{last}.attn.v"]
    with backbone.record(names) as rec:
        h = backbone.run_blocks(backbone.embed(pixels), 0, spec.num_blocks)[:, 0].float()  # [B, D]
        patterns = [rec[f"blocks.{i}.attn.pattern"] for i in range(spec.num_blocks)]
        v = rec[f"blocks.{last}.attn.v"].float()  # [B, H, N, Dh]
    a = patterns[-1][:, :, 0, p:].float()  # [B, H, K]: the CLS row over spatial tokens
    b, heads, k = a.shape
    u = (a.unsqueeze(-1) * v[:, :, p:]).permute(0, 2, 1, 3).reshape(b, k, -1)  # [B, K, D] per-token values
    c = scale(u @ proj.weight.float().T)  # [B, K, D]: bias excluded (it belongs to the rest)
    lin = frozen_layer_norm(c, h, norm.weight, norm.eps)  # the final norm's linear part, statistics of h
    z = norm(h).float()  # [B, D] the final-norm CLS token
    linear_proj = projection.weight if isinstance(projection, nn.Linear) else projection
    parts = project_tokens(lin, linear_proj)  # no bias on parts: it belongs to the rest
    embedding = project_tokens(z.unsqueeze(1), projection).squeeze(1)
    return ClsParts(parts, embedding - parts.sum(1), a.mean(1), patterns)
