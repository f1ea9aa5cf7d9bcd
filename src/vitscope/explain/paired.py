"""Explain why two images are similar: per-token contributions to the cosine similarity (paper 000).

Transformers: the final-norm spatial tokens, through the optional projection, decomposed exactly
(:func:`vitscope.functional.paired_similarity`), then redistributed over the input patches with the
attention rollout (METHODS.md section 4). CNNs: the same decomposition over the positions of the last
feature map (the projection acts as a 1x1 convolution), without rollout. Images are encoded once
(:meth:`PairedSimilarity.encode`); explaining any pair of encoded images needs no forward pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vitscope.functional.rollout import rollout as attention_rollout
from vitscope.functional.similarity import paired_similarity
from vitscope.models.backbone import Backbone

__all__ = ["Encoded", "PairExplanation", "PairedSimilarity"]


@dataclass
class Encoded:
    """Images encoded for explanation.

    Attributes:
        tokens: ``[B, K, D]`` final spatial tokens (CNN: map positions, row-major).
        rollout: ``[B, K, K]`` rollout over spatial tokens, or None (CNNs, or rollout off).
        grid: ``(h, w)`` token grid.
    """

    tokens: torch.Tensor
    rollout: torch.Tensor | None
    grid: tuple[int, int]

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def select(self, index: torch.Tensor | Sequence[int]) -> Encoded:
        idx = torch.as_tensor(index, dtype=torch.long)
        return Encoded(self.tokens[idx], None if self.rollout is None else self.rollout[idx], self.grid)


@dataclass
class PairExplanation:
    """Maps of a batch of pairs (a_i, b_i).

    Attributes:
        score: ``[B]`` cosine similarity of the embeddings.
        map_a, map_b: ``[B, h, w]`` contributions after rollout redistribution (equal to ``raw_*``
            without rollout); with ``transpose=True`` each still sums to ``score``.
        raw_a, raw_b: ``[B, h, w]`` token contributions; each sums exactly to ``score``.
        rollout_a, rollout_b: ``[B, h, w]`` output-agnostic rollout maps (flow from each input patch to
            the mean-pooled output), or None.
    """

    score: torch.Tensor
    map_a: torch.Tensor
    map_b: torch.Tensor
    raw_a: torch.Tensor
    raw_b: torch.Tensor
    rollout_a: torch.Tensor | None = None
    rollout_b: torch.Tensor | None = None


class PairedSimilarity:
    """Paired similarity maps for a backbone's mean-pooled (optionally projected) embedding.

    Args:
        backbone: a transformer or CNN Backbone.
        pooling: ``"mean"`` (paper 000's networks). CLS-pooled embeddings are not decomposed yet.
        projection: None, a ``[E, D]`` matrix, an ``nn.Linear``, or ``"head"`` for the backbone's own
            head (the tiny zoo's metric models keep their projection there).
        rollout: redistribute contributions with the attention rollout (transformers only).
        transpose: use ``R^T`` instead of ``R`` (preserves the sums; the published code uses ``R``).
        head_fusion, discard_ratio: rollout options (METHODS.md section 1).
    """

    def __init__(self, backbone: Backbone, pooling: str = "mean", projection: Any = None, rollout: bool = True,
                 transpose: bool = False, head_fusion: str = "mean", discard_ratio: float = 0.0) -> None:
        if pooling != "mean":
            raise ValueError("only pooling='mean' is decomposed exactly; CLS pooling is not supported yet")
        self.backbone = backbone
        self.is_cnn = backbone.spec.num_heads == 0
        if isinstance(projection, str):
            if projection != "head":
                raise ValueError(f"projection must be None, a tensor, an nn.Linear or 'head', got '{projection}'")
            projection = _head_linear(backbone)
        self.projection = projection
        self.use_rollout = rollout and not self.is_cnn
        self.transpose, self.head_fusion, self.discard_ratio = transpose, head_fusion, discard_ratio

    @torch.no_grad()
    def encode(self, pixels: torch.Tensor) -> Encoded:
        """Run the model once: ``[B, 3, H, W]`` preprocessed pixels -> :class:`Encoded`."""
        b = self.backbone
        spec = b.spec
        if self.is_cnn:
            fmap = b.final_norm(b.run_blocks(b.embed(pixels), 0, spec.num_blocks))  # [B, C, h, w]
            return Encoded(fmap.flatten(2).transpose(1, 2).float(), None, (fmap.shape[2], fmap.shape[3]))
        grid = spec.grid_for(pixels.shape[-2], pixels.shape[-1])
        names = [f"blocks.{i}.attn.pattern" for i in range(spec.num_blocks)] if self.use_rollout else []
        with b.record(names) as rec:
            tokens = b.final_norm(b.run_blocks(b.embed(pixels), 0, spec.num_blocks))
        spatial = tokens[:, spec.num_prefix_tokens:].float()
        roll = None
        if self.use_rollout:
            roll = attention_rollout([rec[n] for n in names], self.head_fusion, self.discard_ratio,
                                     num_prefix=spec.num_prefix_tokens)
        return Encoded(spatial, roll, tuple(grid))

    @torch.no_grad()
    def explain_encoded(self, a: Encoded, b: Encoded) -> PairExplanation:
        """Maps for the pairs ``(a[i], b[i])`` of two equally long encoded sets; no forward pass."""
        if len(a) != len(b):
            raise ValueError(f"need as many first as second images, got {len(a)} and {len(b)}")
        ga, gb, score = paired_similarity(a.tokens, b.tokens, self.projection)
        ma, mb = self._redistribute(ga, a), self._redistribute(gb, b)
        ra = rb = None
        if a.rollout is not None and b.rollout is not None:
            ra, rb = a.rollout.mean(1).reshape(-1, *a.grid), b.rollout.mean(1).reshape(-1, *b.grid)
        return PairExplanation(score, ma.reshape(-1, *a.grid), mb.reshape(-1, *b.grid), ga.reshape(-1, *a.grid),
                               gb.reshape(-1, *b.grid), ra, rb)

    def explain(self, images_a: Any, images_b: Any) -> PairExplanation:
        """Maps for pairs of images (preprocessed ``[B, 3, H, W]`` tensors, or lists of PIL images)."""
        return self.explain_encoded(self.encode(self._pixels(images_a)), self.encode(self._pixels(images_b)))

    def _pixels(self, images: Any) -> torch.Tensor:
        if isinstance(images, torch.Tensor):
            return images if images.dim() == 4 else images.unsqueeze(0)
        return self.backbone.preprocess(list(images))

    def _redistribute(self, gamma: torch.Tensor, enc: Encoded) -> torch.Tensor:
        if enc.rollout is None:
            return gamma
        r = enc.rollout.to(gamma.dtype)
        r = r.transpose(1, 2) if self.transpose else r
        return (r @ gamma.unsqueeze(-1)).squeeze(-1)


def _head_linear(backbone: Backbone) -> nn.Linear:
    model = backbone.model
    head = getattr(model, "head", None) or getattr(model, "fc", None)
    if not isinstance(head, nn.Linear):
        raise ValueError(f"{backbone.spec.name} has no linear head to use as the projection")
    return head
