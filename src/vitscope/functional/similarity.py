"""Paired image similarity decomposed over tokens (paper 000; docs/methods.md, Paired image similarity), and
retrieval metrics.

Pure tensor functions: no I/O, no plotting, no global state.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from vitscope.errors import VitscopeTypeError, VitscopeValueError
from vitscope.functional.retrieval_scores import recall_at_k_map_at_r

__all__ = ["cosine_topk", "decomposed_similarity", "display_map", "frozen_layer_norm", "paired_similarity",
           "project_tokens", "redistribute", "retrieval_metrics"]


def project_tokens(tokens: torch.Tensor, projection: torch.Tensor | nn.Linear | None) -> torch.Tensor:
    """Apply the embedding projection to every token: ``[B, K, D]`` -> ``[B, K, E]``.

    Args:
        tokens: token features.
        projection: None (identity), a weight matrix ``[E, D]`` (as ``nn.Linear.weight``), or an
            ``nn.Linear`` whose bias is applied too (a linear map with bias commutes with the mean).
    """
    if projection is None:
        return tokens
    if isinstance(projection, nn.Linear):
        return nn.functional.linear(tokens, projection.weight.to(tokens), None if projection.bias is None
                                    else projection.bias.to(tokens))
    if isinstance(projection, torch.Tensor):
        if projection.dim() != 2 or projection.shape[1] != tokens.shape[-1]:
            raise VitscopeValueError(f"projection must be [E, {tokens.shape[-1]}], got {tuple(projection.shape)}")
        return tokens @ projection.to(tokens).T
    raise VitscopeTypeError("projection must be None, a [E, D] tensor or an nn.Linear, got "
                            f"{type(projection).__name__}")


def frozen_layer_norm(parts: torch.Tensor, total: torch.Tensor, weight: torch.Tensor | None,
                      eps: float) -> torch.Tensor:
    """Each part's share of ``LayerNorm(total)``, the norm's statistics frozen at ``total``'s actual values.

    With ``sigma = sqrt(var(total) + eps)`` fixed, the norm is linear in its input:
    ``x -> weight * (x - mean(x)) / sigma``; a part's share is that map of the part. The shares of parts that add
    up to ``total`` add up to ``LayerNorm(total)`` less the norm's bias, exactly.

    Args:
        parts: ``[B, K, D]`` parts of the norm's input (per token or position).
        total: ``[B, D]`` the norm's whole input (its statistics are read from it).
        weight: ``[D]`` the norm's scale, or None (1).
        eps: the norm's epsilon.

    Returns:
        ``[B, K, D]``.
    """
    sigma = torch.sqrt(total.var(-1, unbiased=False) + eps)  # [B]
    centred = parts - parts.mean(-1, keepdim=True)
    scaled = centred / sigma[:, None, None]
    return scaled if weight is None else weight.to(scaled) * scaled


def paired_similarity(
    tokens_a: torch.Tensor, tokens_b: torch.Tensor, projection: torch.Tensor | nn.Linear | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decompose the cosine similarity of two mean-pooled embeddings into per-token contributions.

    With projected tokens ``alpha`` and embeddings ``beta = mean(alpha)``, the contribution of token x of
    image a is ``gamma_a[x] = alpha_a[x] . beta_b / (K_a * ||beta_a|| * ||beta_b||)``, so that
    ``gamma_a.sum(-1) == score == gamma_b.sum(-1)`` (docs/methods.md, Paired image similarity).

    Args:
        tokens_a: ``[B, Ka, D]`` spatial tokens of the first images (prefix tokens already removed).
        tokens_b: ``[B, Kb, D]`` spatial tokens of the second images.
        projection: see :func:`project_tokens`.

    Returns:
        ``gamma_a [B, Ka]``, ``gamma_b [B, Kb]`` and ``score [B]`` (cosine similarity of the embeddings).
    """
    for name, t in (("tokens_a", tokens_a), ("tokens_b", tokens_b)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise VitscopeValueError(f"{name} must be a [B, K, D] tensor, got {getattr(t, 'shape', type(t).__name__)}")
    if tokens_a.shape[0] != tokens_b.shape[0] or tokens_a.shape[2] != tokens_b.shape[2]:
        raise VitscopeValueError(f"tokens_a {tuple(tokens_a.shape)} and tokens_b {tuple(tokens_b.shape)} must share B "
                                 "and D")
    dtype = torch.float64 if tokens_a.dtype == torch.float64 else torch.float32
    alpha_a = project_tokens(tokens_a.to(dtype), projection)
    alpha_b = project_tokens(tokens_b.to(dtype), projection)
    beta_a, beta_b = alpha_a.mean(1), alpha_b.mean(1)  # [B, E]
    norm = beta_a.norm(dim=-1) * beta_b.norm(dim=-1)  # [B]
    gamma_a = (alpha_a @ beta_b.unsqueeze(-1)).squeeze(-1) / (alpha_a.shape[1] * norm.unsqueeze(-1))
    gamma_b = (alpha_b @ beta_a.unsqueeze(-1)).squeeze(-1) / (alpha_b.shape[1] * norm.unsqueeze(-1))
    score = (beta_a * beta_b).sum(-1) / norm
    return gamma_a, gamma_b, score


def decomposed_similarity(
    parts_a: torch.Tensor, parts_b: torch.Tensor, rest_a: torch.Tensor | None = None,
    rest_b: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decompose the cosine similarity of embeddings given as sums of per-token parts.

    Each embedding is ``e = parts.sum(1) + rest``; token x of image a contributes
    ``parts_a[x] . e_b / (||e_a|| ||e_b||)`` and the rest ``rest_a . e_b / (||e_a|| ||e_b||)``, so
    ``gamma_a.sum(-1) + residual_a == score`` exactly. Mean pooling is the case ``parts = alpha / K``
    and ``rest = 0`` (:func:`paired_similarity`); a CLS embedding decomposed through the last block
    has a non-zero rest (the CLS token's own stream, the MLP and the biases).

    Args:
        parts_a: ``[B, Ka, E]`` per-token parts of the first embeddings.
        parts_b: ``[B, Kb, E]`` per-token parts of the second embeddings.
        rest_a, rest_b: ``[B, E]`` parts not attributed to any token, or None (zero).

    Returns:
        ``gamma_a [B, Ka]``, ``gamma_b [B, Kb]``, ``score [B]``, ``residual_a [B]``, ``residual_b [B]``.
    """
    if parts_a.dim() != 3 or parts_b.dim() != 3 or parts_a.shape[0] != parts_b.shape[0] \
            or parts_a.shape[2] != parts_b.shape[2]:
        raise VitscopeValueError(f"parts must be [B, K, E] with equal B and E, got {tuple(parts_a.shape)} and "
                                 f"{tuple(parts_b.shape)}")
    dtype = torch.float64 if parts_a.dtype == torch.float64 else torch.float32
    pa, pb = parts_a.to(dtype), parts_b.to(dtype)
    ra = torch.zeros_like(pa[:, 0]) if rest_a is None else rest_a.to(dtype)
    rb = torch.zeros_like(pb[:, 0]) if rest_b is None else rest_b.to(dtype)
    ea, eb = pa.sum(1) + ra, pb.sum(1) + rb  # [B, E]
    norm = (ea.norm(dim=-1) * eb.norm(dim=-1)).clamp_min(torch.finfo(dtype).tiny)  # [B]
    gamma_a = (pa @ eb.unsqueeze(-1)).squeeze(-1) / norm.unsqueeze(-1)
    gamma_b = (pb @ ea.unsqueeze(-1)).squeeze(-1) / norm.unsqueeze(-1)
    return gamma_a, gamma_b, (ea * eb).sum(-1) / norm, (ra * eb).sum(-1) / norm, (rb * ea).sum(-1) / norm


def redistribute(gamma: torch.Tensor, rollout: torch.Tensor, transpose: bool = False) -> torch.Tensor:
    """Move token contributions to input patches with a rollout matrix (paper 000 eq. 6).

    ``R[q, k]`` is the flow from input k to output q (rows sum to 1). ``R @ gamma`` is what the published
    code computes; ``R^T @ gamma`` gives input k the share ``R[q, k]`` of every output's contribution and
    alone preserves the sum.

    Args:
        gamma: ``[B, K]`` contributions of the output tokens.
        rollout: ``[B, K, K]`` row-stochastic rollout over the same tokens.
        transpose: use ``R^T``.

    Returns:
        ``[B, K]``.
    """
    if rollout.dim() != 3 or rollout.shape[0] != gamma.shape[0] or rollout.shape[1:] != (gamma.shape[1],) * 2:
        raise VitscopeValueError(f"rollout must be [B, K, K] for gamma {tuple(gamma.shape)}, got "
                                 f"{tuple(rollout.shape)}")
    r = rollout.to(gamma.dtype)
    r = r.transpose(1, 2) if transpose else r
    return (r @ gamma.unsqueeze(-1)).squeeze(-1)


def cosine_topk(
    queries: torch.Tensor, gallery: torch.Tensor, k: int, exclude: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The k gallery items most cosine-similar to each query.

    Args:
        queries: ``[Q, E]`` embeddings.
        gallery: ``[G, E]`` embeddings.
        k: neighbours per query (``<= G``, minus one when excluding).
        exclude: ``[Q]`` gallery index never returned for each query (the query itself in leave-one-out
            retrieval), or None. Negative entries exclude nothing.

    Returns:
        ``scores [Q, k]`` (descending) and ``indices [Q, k]`` (int64); ties go to the lower index.
    """
    limit = gallery.shape[0] - (0 if exclude is None else 1)
    if not 1 <= k <= limit:
        raise VitscopeValueError(f"k must be in [1, {limit}] for a gallery of {gallery.shape[0]}, got {k}")
    sims = torch.nn.functional.normalize(queries.double(), dim=-1) @ \
        torch.nn.functional.normalize(gallery.double(), dim=-1).T  # [Q, G]
    if exclude is not None:
        rows = torch.arange(len(queries))[exclude >= 0]
        sims[rows, exclude[exclude >= 0]] = -float("inf")
    order = torch.sort(sims, dim=-1, descending=True, stable=True).indices[:, :k]
    return sims.gather(1, order).float(), order


def upsample_maps(maps: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``[B, h, w]`` token maps -> ``[B, H, W]`` float32, bicubic (values keep their sign and scale)."""
    return torch.nn.functional.interpolate(maps.float().unsqueeze(1), size=tuple(size), mode="bicubic",
                                           align_corners=False).squeeze(1)


def display_map(maps: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Maps as displayed (docs/methods.md, Paired image similarity): bicubic upsampling to ``size``, then min-max
    per map.

    Args:
        maps: ``[B, h, w]``.
        size: ``(H, W)`` image size.

    Returns:
        ``[B, H, W]`` float32 in [0, 1] (a constant map, or one holding NaN, becomes all zeros).
    """
    up = upsample_maps(maps, size)
    lo = up.flatten(1).min(1).values[:, None, None]
    span = up.flatten(1).max(1).values[:, None, None] - lo
    # bicubic weights leave a constant map uneven by float32 rounding (1e-7 of its value): min-max would blow
    # that up to the full colour range, so a map flat to float precision counts as constant
    scale = up.flatten(1).abs().max(1).values[:, None, None]
    flat = (span <= 1e-5 * scale.clamp_min(1e-30)) | span.isnan()  # NaN anywhere: no scale to show
    return torch.where(flat, torch.zeros_like(up), (up - lo) / span.clamp_min(1e-12))


def retrieval_metrics(
    embeddings: torch.Tensor, labels: torch.Tensor | np.ndarray, ks: Sequence[int] = (1, 2, 4, 8),
) -> dict[str, float]:
    """Leave-one-out Recall@k and mAP@R with cosine similarity (paper 000 table 2).

    Every item queries all others; queries whose label has no other item are skipped.

    Args:
        embeddings: ``[n, d]``.
        labels: ``[n]`` integer labels.
        ks: the k of Recall@k.

    Returns:
        ``{"recall@1": ..., "recall@2": ..., "map@r": ...}`` as Python floats.
    """
    raw = recall_at_k_map_at_r(embeddings, labels, ks=ks)
    out = {f"recall@{k}": raw[f"R@{k}"] for k in ks}
    out["map@r"] = raw["mAP@R"]
    return out
