"""Attention entropy and the attention focus index per block and head (docs/methods.md, Attention)."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from vitscope.analyses.attention.base import AttentionAccumulator, AttentionGeometry
from vitscope.analyses.base import Batch, Figure, Result
from vitscope.analyses.registry import register_analysis
from vitscope.analyses.state import added
from vitscope.functional.attention_blocks import BlockStats
from vitscope.viz.charts import block_lines_chart, curve
from vitscope.viz.ranges import quantity_range

__all__ = ["AttentionFocus", "AttentionFocusResult"]


class AttentionFocusResult(Result):
    """Result of :class:`AttentionFocus`: heatmaps and the per-block means vs random."""

    DIMS = {"*": ("block", "head")}

    def figures(self) -> list[Figure]:
        """``<name>_entropy``, ``<name>_focus`` (blocks x heads) and ``<name>_blocks`` (means vs random)."""
        if "entropy" not in self.tensors:
            return []
        n, labels, t = self.meta.get("num_images", 0), self.meta.get("blocks"), self.tensors

        def lines(path: Path) -> list[Path]:
            from vitscope.viz.attention_figures import block_lines_figure

            series = {"entropy / log N": (t["entropy_normalised"].mean(-1), t["random_entropy_normalised"].mean(-1)),
                      "focus / log K": (t["focus_normalised"].mean(-1), t["random_focus_normalised"].mean(-1))}
            return block_lines_figure(series, "Mean over heads (dashed: random attention)", "normalised value", path,
                                      block_labels=labels, value_range=quantity_range("focus_normalised"))

        curves = []
        for name, key in (("entropy / log N", "entropy_normalised"), ("focus / log K", "focus_normalised")):
            curves += [curve(name, t[key].mean(-1), name), curve(name, t[f"random_{key}"].mean(-1), name, "dashed")]
        chart = block_lines_chart(curves, "normalised value", t["entropy"].shape[0], labels,
                                  "Mean over heads (dashed: random attention)", quantity_range("focus_normalised"))
        paper = "paper 003, focus index (eq. 5)"
        return [
            self.heatmap_figure("_entropy", t["entropy"], f"Attention entropy per head ({n} images)", "entropy (nats)",
                                "Attention entropy per block and head (nats); lower is more focused.", paper,
                                block_labels=labels),
            self.heatmap_figure("_focus", t["focus"], f"Attention focus index per head ({n} images; lower = more "
                                "focused)", "focus index (nats)",
                                "Attention focus index per block and head; lower is more focused.", paper,
                                block_labels=labels),
            self.figure("_blocks", lines, "Entropy and focus index per block, normalised and averaged over heads, "
                        "with random attention dashed.", paper, chart=chart),
        ]


@register_analysis("attention_focus", groups=("attention",), order=80)
class AttentionFocus(AttentionAccumulator):
    """Mean over images of the plain attention entropy and of the attention focus index, per block and head.

    Per image and head: the entropy is :func:`~vitscope.functional.attention_entropy` (Shannon entropy
    in nats of each row over all keys, mean over queries); the focus index is
    :func:`~vitscope.functional.focus_index` (paper 003 eq. 5: each spatial row of the spatial attention
    min-max normalised, then its entropy; mean over spatial queries; lower = more focused).

    State: ``num_images``, ``geometry``, ``entropy_sum`` and ``focus_sum`` ``[L, H]`` float64.

    Result tensors: ``entropy``, ``entropy_normalised`` (/ log N), ``focus``, ``focus_normalised``
    (/ log K; 0 when K = 1), each ``[L, H]``, and the same four with a ``random_`` prefix for the random
    baseline (row-stochastic random patterns, the same units). meta: the geometry, ``num_images``, ``random``.
    """

    description = ("Attention entropy and the focus index of paper 003 (entropy of min-max normalised spatial rows): "
                   "lower means more focused attention.")
    summary = "entropy and focus index"

    NEEDS = frozenset({"entropy", "focus"})

    def _declare_sums(self) -> None:
        self.add_state("entropy_sum", None, reduce="sum")  # [L, H] float64
        self.add_state("focus_sum", None, reduce="sum")

    @staticmethod
    def _sums(stats: list[BlockStats] | tuple[BlockStats, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        entropy = torch.stack([s.entropy.sum(dim=0) for s in stats]).to(torch.float64)
        focus = torch.stack([s.focus.sum(dim=0) for s in stats]).to(torch.float64)
        return entropy, focus

    def _update_blocks(self, geometry: AttentionGeometry, stats: list[BlockStats], batch: Batch) -> None:
        entropy, focus = self._sums(stats)
        self.entropy_sum, self.focus_sum = added(self.entropy_sum, entropy), added(self.focus_sum, focus)
        self.num_images += stats[0].batch_size

    def compute(self) -> AttentionFocusResult:
        meta = self._base_meta()
        if self.num_images == 0:
            return AttentionFocusResult(name=self.name, tensors={}, meta=meta)
        g = self.geometry
        log_n, log_k = math.log(g.num_tokens), math.log(g.num_spatial)
        random_entropy, random_focus = (x / self._cfg_random_samples for x in self._sums(self._random()))
        tensors = {}
        for prefix, entropy, focus in (("", self.entropy_sum / self.num_images, self.focus_sum / self.num_images),
                                       ("random_", random_entropy, random_focus)):
            tensors[f"{prefix}entropy"] = entropy
            tensors[f"{prefix}entropy_normalised"] = entropy / log_n if log_n > 0 else torch.zeros_like(entropy)
            tensors[f"{prefix}focus"] = focus
            tensors[f"{prefix}focus_normalised"] = focus / log_k if log_k > 0 else torch.zeros_like(focus)
        return AttentionFocusResult(name=self.name, tensors=tensors, meta=meta)
