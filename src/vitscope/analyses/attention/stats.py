"""Per-head attention entropy and peakedness over a dataset (``AttentionStats``)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from vitscope.analyses.base import Analysis, Batch, Figure, Result
from vitscope.analyses.batch import ATTENTION_BLOCKS, recorded_patterns
from vitscope.analyses.registry import register_analysis
from vitscope.analyses.state import added
from vitscope.errors import VitscopeValueError
from vitscope.models.spec import ModelSpec

__all__ = ["AttentionStats", "AttentionStatsResult"]

PATTERN_HOOKS = "blocks.*.attn.pattern"
_NEEDS = frozenset({"entropy", "peak"})  # the shared pass computes them with the functions named below


class AttentionStatsResult(Result):
    """Result of :class:`AttentionStats`: blocks x heads heatmaps of entropy and maximum attention."""

    DIMS = {"*": ("block", "head")}

    def figures(self) -> list[Figure]:
        """``<name>_entropy`` and ``<name>_max_attention``: blocks x heads heatmaps."""
        if "entropy" not in self.tensors:
            return []
        labels, n, t = self.meta.get("blocks"), self.meta.get("num_images", 0), self.tensors
        return [
            self.heatmap_figure("_entropy", t["entropy"], f"Attention entropy per head (mean over {n} images)",
                                "entropy (nats)", "Attention entropy per block and head (nats, mean over images); "
                                "low entropy marks focused heads.", block_labels=labels),
            self.heatmap_figure("_max_attention", t["max_attention"], f"Mean max attention per head ({n} images)",
                                "mean over queries of the row maximum", "The largest attention weight of every "
                                "row, averaged over queries and images.", block_labels=labels,
                                quantity="max_attention"),
        ]


@register_analysis("attention_stats", order=20)
class AttentionStats(Analysis):
    """Mean over images of the plain attention entropy and of the max attention, per block and head.

    Per image and head the values are :func:`~vitscope.functional.attention_stats.attention_entropy`
    (Shannon entropy in nats of each row over all keys, mean over queries) and
    :func:`~vitscope.functional.attention_stats.max_attention`. State: float64 sums ``[L, H]`` on the
    CPU, the image count, the block indices seen and the token count.

    Result tensors: ``entropy`` ``[L, H]`` (nats), ``entropy_normalised`` ``[L, H]`` = entropy /
    log(N) (0 when N = 1), ``max_attention`` ``[L, H]``; rows follow ``meta["blocks"]``.
    meta: ``num_images``, ``num_tokens`` (of most images), ``blocks``; with images of several token grids,
    ``tokens`` (images per sequence length) and ``entropy_normalised`` divides each image's entropy by the log of
    its own number of tokens.
    """

    description = ("Entropy of every attention row over all keys and the largest attention weight, per block and "
                   "head: low entropy means focused heads.")
    summary = "entropy and max attention per block and head"

    needs_attention = True

    def __init__(self) -> None:
        super().__init__()
        self.add_state("num_images", 0, reduce="sum")
        self.add_state("tokens", {}, reduce="sum")  # N (tokens of an image) -> images
        # each image's entropy over the log of its own N (images of several token grids)
        self.add_state("blocks", [], reduce="same")
        self.add_state("sum_entropy", None, reduce="sum")  # [L, H] float64
        self.add_state("sum_max", None, reduce="sum")
        self.add_state("sum_entropy_normalised", None, reduce="sum")

    def required_hooks(self, spec: ModelSpec) -> list[str]:
        return [PATTERN_HOOKS]

    def record_reads(self, spec: ModelSpec) -> list[str]:
        return []  # values come through the shared block statistics

    def shared_quantities(self, spec: ModelSpec) -> dict[str, frozenset[str]]:
        return {ATTENTION_BLOCKS: _NEEDS}

    def update(self, record: Mapping[str, torch.Tensor], batch: Batch) -> None:
        """Add one batch: reads every ``blocks.{i}.attn.pattern`` ``[B, H, N, N]`` in the record."""
        found = recorded_patterns(record)
        if not found:
            raise VitscopeValueError(
                "attention_stats: the record holds no 'blocks.{i}.attn.pattern'; record "
                f"{PATTERN_HOOKS!r} (required_hooks) on a transformer"
            )
        shape = None
        for _, key in found:
            pattern = record[key]
            if pattern.dim() != 4 or pattern.shape[-1] != pattern.shape[-2] or (
                    shape is not None and pattern.shape != shape):
                raise VitscopeValueError(
                    f"attention_stats: '{key}' has shape {tuple(pattern.shape)}; expected [B, H, N, N] "
                    "with the same shape in every block"
                )
            shape = pattern.shape
        if shape[0] == 0:
            return
        blocks = batch.quantity(ATTENTION_BLOCKS, record, _NEEDS)
        entropy = [blocks[i].entropy.double().sum(dim=0) for i, _ in found]
        peak = [blocks[i].peak.double().sum(dim=0) for i, _ in found]
        self._add([i for i, _ in found], int(shape[0]), int(shape[-1]), torch.stack(entropy), torch.stack(peak))

    def _add(self, blocks: list[int], n: int, num_tokens: int, s_ent: torch.Tensor, s_max: torch.Tensor) -> None:
        """Add sums ``[L, H]`` over ``n`` images of ``num_tokens`` tokens each."""
        if n == 0:
            return
        log_n = math.log(num_tokens)
        s_norm = s_ent / log_n if log_n > 0 else torch.zeros_like(s_ent)
        self.tokens[str(num_tokens)] = self.tokens.get(str(num_tokens), 0) + n
        if self.num_images == 0:
            self.blocks = list(blocks)
            self.sum_entropy, self.sum_max, self.sum_entropy_normalised = s_ent.clone(), s_max.clone(), s_norm
            self.num_images = n
            return
        if list(blocks) != self.blocks or s_ent.shape != self.sum_entropy.shape:
            raise VitscopeValueError(
                f"attention_stats: blocks {list(blocks)} x {s_ent.shape[-1]} heads do not match the "
                f"accumulated blocks {self.blocks} x {self.sum_entropy.shape[-1]} heads"
            )
        self.sum_entropy = added(self.sum_entropy, s_ent)
        self.sum_entropy_normalised = added(self.sum_entropy_normalised, s_norm)
        self.sum_max = added(self.sum_max, s_max)
        self.num_images += n

    def compute(self) -> AttentionStatsResult:
        counts = sorted(((int(n), k) for n, k in self.tokens.items()), key=lambda nk: (-nk[1], nk[0]))  # most first
        meta = {"num_images": self.num_images, "num_tokens": int(counts[0][0]) if counts else 0,
                "blocks": list(self.blocks)}
        if len(counts) > 1:
            meta["tokens"] = {str(n): int(k) for n, k in counts}  # images of every sequence length
        if self.num_images == 0:
            return AttentionStatsResult(name=self.name, tensors={}, meta=meta)
        entropy = self.sum_entropy / self.num_images
        if len(counts) == 1:
            log_n = math.log(counts[0][0])
            normalised = entropy / log_n if log_n > 0 else torch.zeros_like(entropy)
        else:  # each image normalised by its own number of tokens
            normalised = self.sum_entropy_normalised / self.num_images
        tensors = {
            "entropy": entropy,
            "entropy_normalised": normalised,
            "max_attention": self.sum_max / self.num_images,
        }
        return AttentionStatsResult(name=self.name, tensors=tensors, meta=meta)
