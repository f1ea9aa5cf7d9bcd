"""Explain why two images are similar: per-token contributions to the cosine similarity (paper 000).

Transformers: the final-norm spatial tokens, through the optional projection, decomposed exactly
(:func:`vitscope.functional.paired_similarity`), then redistributed over the input patches with the
attention rollout (docs/methods.md, Paired image similarity). CNNs: the same decomposition over the positions of
the last feature map (the projection acts as a 1x1 convolution; ConvNeXt's LayerNorm after the mean with its
statistics frozen), without rollout. Images are encoded once
(:meth:`PairedSimilarity.encode`: embedding parts, rollout and output-agnostic map cached); explaining any
pair of encoded images is a few matrix products, never a forward pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vitscope.errors import VitscopeValueError
from vitscope.explain.cls_pooling import cls_parts
from vitscope.functional.rollout import rollout as attention_rollout
from vitscope.functional.similarity import decomposed_similarity, frozen_layer_norm, project_tokens, redistribute
from vitscope.models.backbone import Backbone
from vitscope.train.data import normalise

__all__ = ["Encoded", "PairExplanation", "PairedSimilarity"]


@dataclass
class Encoded:
    """Images encoded for explanation (everything an explanation needs, no forward pass later).

    Attributes:
        parts: ``[B, K, E]`` per-token parts of the embedding (mean pooling: projected tokens / K; CNN:
            map positions, row-major).
        grid: ``(h, w)`` token grid.
        rest: ``[B, E]`` part of the embedding no token owns (CLS pooling; ConvNeXt: its pooled norm's bias), or
            None.
        rest_weights: ``[B, K]`` how the rest's contribution is spread over the tokens (CLS pooling: the
            last block's CLS attention; ConvNeXt: evenly), or None.
        rollout: ``[B, K, K]`` rollout over spatial tokens (``R[q, k]``: flow from input k to output q), or
            None (CNNs, or rollout off).
        agnostic: ``[B, K]`` output-agnostic rollout map (flow from each input patch to the pooled
            output, sums to 1), or None.
    """

    parts: torch.Tensor
    grid: tuple[int, int]
    rest: torch.Tensor | None = None
    rest_weights: torch.Tensor | None = None
    rollout: torch.Tensor | None = None
    agnostic: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.parts.shape[0]

    @property
    def embeddings(self) -> torch.Tensor:
        """``[B, E]`` the embeddings the parts add up to."""
        return self.parts.sum(1) + (0 if self.rest is None else self.rest)

    def select(self, index: torch.Tensor | Sequence[int]) -> Encoded:
        """The images at ``index`` (repeats allowed)."""
        idx = torch.as_tensor(index, dtype=torch.long)

        def pick(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[idx]

        return Encoded(self.parts[idx], self.grid, pick(self.rest), pick(self.rest_weights), pick(self.rollout),
                       pick(self.agnostic))

    @staticmethod
    def cat(items: Sequence[Encoded]) -> Encoded:
        """Concatenate encoded batches (same grid)."""
        def cat(name: str) -> torch.Tensor | None:
            vals = [getattr(e, name) for e in items]
            return None if vals[0] is None else torch.cat(vals)

        return Encoded(cat("parts"), items[0].grid, cat("rest"), cat("rest_weights"), cat("rollout"),
                       cat("agnostic"))


@dataclass
class PairExplanation:
    """Maps of a batch of pairs (a_i, b_i).

    Attributes:
        score: ``[B]`` cosine similarity of the embeddings.
        map_a, map_b: ``[B, h, w]`` contributions after rollout redistribution (``raw_*`` plus the spread
            residual without rollout); with ``transpose=True`` or without rollout each sums to ``score``.
        raw_a, raw_b: ``[B, h, w]`` token contributions; each sums exactly to ``score - residual``.
        residual_a, residual_b: ``[B]`` contribution of the embedding part no token owns (0 for mean
            pooling and CNNs but ConvNeXt; CLS pooling and ConvNeXt: spread over the tokens in ``map_*``).
        rollout_a, rollout_b: ``[B, h, w]`` output-agnostic rollout maps, or None.
    """

    score: torch.Tensor
    map_a: torch.Tensor
    map_b: torch.Tensor
    raw_a: torch.Tensor
    raw_b: torch.Tensor
    rollout_a: torch.Tensor | None = None
    rollout_b: torch.Tensor | None = None
    residual_a: torch.Tensor | None = None
    residual_b: torch.Tensor | None = None


class PairedSimilarity:
    """Paired similarity maps for a backbone's (optionally projected) embedding.

    What is exact and what is approximate:

    * ``pooling="mean"`` (paper 000's networks, and CNNs): the raw maps are exact, each sums to the cosine
      score (float rounding aside), and swapping the pair swaps the maps. ConvNeXt normalises the mean with a
      LayerNorm: each position's share goes through it with the norm's statistics frozen at their actual
      values (exact for these inputs); the norm's bias is the residual, spread evenly over the positions in
      ``map``.
    * ``pooling="cls"``: the CLS embedding is decomposed through the last block
      (:mod:`vitscope.explain.cls_pooling`): each spatial token's value path through the last attention,
      the final LayerNorm with its statistics frozen at their actual values, and the projection, which is
      exact for these inputs (``raw.sum() + residual == score``). The residual (the CLS token's own stream,
      the MLP, the biases) has no exact owner; it is spread over the tokens in proportion to the last
      block's CLS attention (an approximation) before redistribution, so ``map`` still sums to the score
      with ``transpose=True``. Redistribution then uses the rollout of the earlier blocks.
    * Rollout redistribution (transformers) is an approximation of attention flow (paper 000 section 3.2):
      ``R @ gamma`` as the published code (rows are outputs, so it does not preserve the sum), or
      ``R^T @ gamma`` with ``transpose=True`` (credits each input patch with its share of every output's
      contribution; preserves the sum).

    Args:
        backbone: a transformer or CNN Backbone.
        pooling: ``"mean"`` (spatial tokens or the CNN map) or ``"cls"`` (transformers with a CLS token).
        projection: None, a ``[E, D]`` matrix, an ``nn.Linear`` (bias applied), or ``"head"`` for the
            backbone's own linear head (the tiny zoo's metric models keep their projection there).
        rollout: redistribute contributions with the attention rollout (transformers only).
        transpose: use ``R^T`` instead of ``R``.
        head_fusion, discard_ratio: rollout options (docs/methods.md, Attention).
        batch_size: images per forward pass in :meth:`encode`.
    """

    def __init__(self, backbone: Backbone, pooling: str = "mean", projection: Any = None, rollout: bool = True,
                 transpose: bool = False, head_fusion: str = "mean", discard_ratio: float = 0.0,
                 batch_size: int = 64) -> None:
        self.backbone = backbone
        self.is_cnn = not backbone.spec.is_transformer
        if pooling not in ("mean", "cls"):
            raise VitscopeValueError(f"pooling must be 'mean' or 'cls', got '{pooling}'")
        if pooling == "cls" and (self.is_cnn or "cls" not in backbone.spec.prefix_kinds):
            raise VitscopeValueError(f"{backbone.spec.name} has no CLS token; use pooling='mean'")
        self.pooling = pooling
        if isinstance(projection, str):
            if projection != "head":
                raise VitscopeValueError("projection must be None, a tensor, an nn.Linear or 'head', got "
                                         f"'{projection}'")
            projection = _head_linear(backbone)
        self.projection = projection
        self.use_rollout = rollout and not self.is_cnn
        self.transpose, self.head_fusion, self.discard_ratio = transpose, head_fusion, discard_ratio
        self.batch_size = batch_size

    # -- encoding (the only forward passes) ---------------------------------------------------------------
    @torch.no_grad()
    def encode(self, images: Any) -> Encoded:
        """Run the model once per batch: images -> :class:`Encoded`.

        Args:
            images: ``[B, 3, H, W]`` preprocessed float pixels, ``[B, 3, H, W]`` uint8 pixels at the model's
                input size (normalised here), or a list of PIL images / ``HxWx3`` uint8 arrays.

        Raises:
            VitscopeValueError: no image (an encoding's widths come from the model's output).
        """
        images = images if isinstance(images, torch.Tensor) else list(images)
        if len(images) == 0:
            raise VitscopeValueError("need at least one image to encode")
        pixels = self.pixels(images)
        chunks = [self._encode(pixels[i:i + self.batch_size]) for i in range(0, len(pixels), self.batch_size)]
        return Encoded.cat(chunks)

    @torch.no_grad()
    def embed(self, images: Any) -> torch.Tensor:
        """``[B, E]`` embeddings only (no rollout); what faithfulness curves re-run on perturbed images."""
        saved, self.use_rollout = self.use_rollout, False
        try:
            return self.encode(images).embeddings
        finally:
            self.use_rollout = saved

    def _encode(self, pixels: torch.Tensor) -> Encoded:
        b = self.backbone
        spec = b.spec
        pixels = pixels.to(b.device)
        if self.is_cnn:
            fmap = b.final_norm(b.run_blocks(b.embed(pixels), 0, spec.num_blocks)).float()  # [B, C, h, w]
            return self._cnn_parts(fmap.flatten(2).transpose(1, 2), (fmap.shape[2], fmap.shape[3]))
        grid = tuple(spec.grid_for(pixels.shape[-2], pixels.shape[-1]))
        p = spec.num_prefix_tokens
        if self.pooling == "cls":
            cp = cls_parts(b, pixels, self.projection)
            enc = Encoded(cp.parts.cpu(), grid, cp.rest.cpu(), (cp.cls_attention / cp.cls_attention.sum(
                -1, keepdim=True).clamp_min(1e-12)).cpu())
            if self.use_rollout:
                before = cp.patterns[:-1]  # the last block's mixing is in the parts already
                k = enc.parts.shape[1]
                enc.rollout = (self._rollout(before, p) if before else
                               torch.eye(k).expand(len(pixels), k, k).clone())
                full = self._rollout(cp.patterns, None)[:, 0, p:]  # CLS row over spatial inputs
                enc.agnostic = (full / full.sum(-1, keepdim=True)).cpu()
            return enc
        names = [f"blocks.{i}.attn.pattern" for i in range(spec.num_blocks)] if self.use_rollout else []
        with b.record(names) as rec:
            tokens = b.final_norm(b.run_blocks(b.embed(pixels), 0, spec.num_blocks))
            patterns = [rec[n] for n in names]
        spatial = tokens[:, p:].float()
        enc = Encoded((project_tokens(spatial, self.projection) / spatial.shape[1]).cpu(), grid)
        if self.use_rollout:
            enc.rollout = self._rollout(patterns, p)
            enc.agnostic = enc.rollout.mean(1)  # column means: flow from each input to the mean-pooled output
        return enc

    def _cnn_parts(self, positions: torch.Tensor, grid: tuple[int, int]) -> Encoded:
        """A CNN's embedding split over the positions ``[B, K, C]`` of its last map: each position's share of the
        mean; through the LayerNorm after the mean (ConvNeXt), with the norm's statistics frozen at their actual
        values, the bias (and the projection's) left in the rest and its contribution spread evenly."""
        k = positions.shape[1]
        norm = getattr(self.backbone, "pooled_norm", None)
        if norm is None:
            return Encoded((project_tokens(positions, self.projection) / k).cpu(), grid)
        pooled = positions.mean(1)  # [B, C]
        linear = frozen_layer_norm(positions / k, pooled, norm.weight, norm.eps)
        weight = self.projection.weight if isinstance(self.projection, nn.Linear) else self.projection
        parts = project_tokens(linear, weight)  # no bias on parts: it belongs to the rest
        embedding = project_tokens(norm(pooled).float().unsqueeze(1), self.projection).squeeze(1)
        even = torch.full((len(positions), k), 1.0 / k)
        return Encoded(parts.cpu(), grid, (embedding - parts.sum(1)).cpu(), even)

    def _rollout(self, patterns: list[torch.Tensor], num_prefix: int | None) -> torch.Tensor:
        return attention_rollout(patterns, self.head_fusion, self.discard_ratio, num_prefix=num_prefix).cpu()

    # -- explaining (no forward pass) ---------------------------------------------------------------------
    @torch.no_grad()
    def explain_encoded(self, a: Encoded, b: Encoded) -> PairExplanation:
        """Maps for the pairs ``(a[i], b[i])`` of two equally long encoded sets; no forward pass."""
        if len(a) != len(b):
            raise VitscopeValueError(f"need as many first as second images, got {len(a)} and {len(b)}")
        ga, gb, score, res_a, res_b = decomposed_similarity(a.parts, b.parts, a.rest, b.rest)
        ma, mb = self._to_map(ga, res_a, a), self._to_map(gb, res_b, b)
        ra = rb = None
        if a.agnostic is not None and b.agnostic is not None:
            ra, rb = a.agnostic.reshape(-1, *a.grid), b.agnostic.reshape(-1, *b.grid)
        return PairExplanation(score, ma.reshape(-1, *a.grid), mb.reshape(-1, *b.grid), ga.reshape(-1, *a.grid),
                               gb.reshape(-1, *b.grid), ra, rb, res_a, res_b)

    def explain_indices(self, a: Encoded, index_a: Any, b: Encoded, index_b: Any) -> PairExplanation:
        """Maps for the pairs ``(a[index_a[i]], b[index_b[i]])`` of two encoded sets; no forward pass."""
        return self.explain_encoded(a.select(index_a), b.select(index_b))

    def explain(self, images_a: Any, images_b: Any) -> PairExplanation:
        """Maps for a batch of pairs of images (any input :meth:`encode` accepts), one forward pass per set."""
        return self.explain_encoded(self.encode(images_a), self.encode(images_b))

    def pixels(self, images: Any) -> torch.Tensor:
        """Any accepted image batch -> ``[B, 3, H, W]`` float pixels in the model's normalisation."""
        if isinstance(images, torch.Tensor):
            x = images if images.dim() == 4 else images.unsqueeze(0)
            if x.dtype == torch.uint8:
                return normalise(x, self.backbone.spec.mean, self.backbone.spec.std)
            return x
        return self.backbone.preprocess(list(images))

    def _to_map(self, gamma: torch.Tensor, residual: torch.Tensor, enc: Encoded) -> torch.Tensor:
        if enc.rest_weights is not None:  # CLS pooling: spread the unowned residual (approximation)
            gamma = gamma + residual.unsqueeze(-1) * enc.rest_weights.to(gamma.dtype)
        if enc.rollout is None:
            return gamma
        return redistribute(gamma, enc.rollout, self.transpose)


def _head_linear(backbone: Backbone) -> nn.Linear:
    model = backbone.model
    head = getattr(model, "head", None) or getattr(model, "fc", None)
    if not isinstance(head, nn.Linear):
        raise VitscopeValueError(f"{backbone.spec.name} has no linear head to use as the projection")
    return head
