"""Paired image similarity decomposed over tokens (paper 000, METHODS.md section 4), and retrieval metrics.

Pure tensor functions: no I/O, no plotting, no global state.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from vitscope.functional.retrieval import recall_at_k_map_at_r

__all__ = ["paired_similarity", "project_tokens", "retrieval_metrics"]


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
            raise ValueError(f"projection must be [E, {tokens.shape[-1]}], got {tuple(projection.shape)}")
        return tokens @ projection.to(tokens).T
    raise TypeError(f"projection must be None, a [E, D] tensor or an nn.Linear, got {type(projection).__name__}")


def paired_similarity(
    tokens_a: torch.Tensor, tokens_b: torch.Tensor, projection: torch.Tensor | nn.Linear | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decompose the cosine similarity of two mean-pooled embeddings into per-token contributions.

    With projected tokens ``alpha`` and embeddings ``beta = mean(alpha)``, the contribution of token x of
    image a is ``gamma_a[x] = alpha_a[x] . beta_b / (K_a * ||beta_a|| * ||beta_b||)``, so that
    ``gamma_a.sum(-1) == score == gamma_b.sum(-1)`` (METHODS.md section 4).

    Args:
        tokens_a: ``[B, Ka, D]`` spatial tokens of the first images (prefix tokens already removed).
        tokens_b: ``[B, Kb, D]`` spatial tokens of the second images.
        projection: see :func:`project_tokens`.

    Returns:
        ``gamma_a [B, Ka]``, ``gamma_b [B, Kb]`` and ``score [B]`` (cosine similarity of the embeddings).
    """
    for name, t in (("tokens_a", tokens_a), ("tokens_b", tokens_b)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"{name} must be a [B, K, D] tensor, got {getattr(t, 'shape', type(t).__name__)}")
    if tokens_a.shape[0] != tokens_b.shape[0] or tokens_a.shape[2] != tokens_b.shape[2]:
        raise ValueError(f"tokens_a {tuple(tokens_a.shape)} and tokens_b {tuple(tokens_b.shape)} must share B and D")
    dtype = torch.float64 if tokens_a.dtype == torch.float64 else torch.float32
    alpha_a = project_tokens(tokens_a.to(dtype), projection)
    alpha_b = project_tokens(tokens_b.to(dtype), projection)
    beta_a, beta_b = alpha_a.mean(1), alpha_b.mean(1)  # [B, E]
    norm = beta_a.norm(dim=-1) * beta_b.norm(dim=-1)  # [B]
    gamma_a = (alpha_a @ beta_b.unsqueeze(-1)).squeeze(-1) / (alpha_a.shape[1] * norm.unsqueeze(-1))
    gamma_b = (alpha_b @ beta_a.unsqueeze(-1)).squeeze(-1) / (alpha_b.shape[1] * norm.unsqueeze(-1))
    score = (beta_a * beta_b).sum(-1) / norm
    return gamma_a, gamma_b, score


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
