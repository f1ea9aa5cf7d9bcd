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
        # the same, each image's divided by the log of its own token counts (images of several grids)
        self.add_state("entropy_normalised_sum", None, reduce="sum")
        self.add_state("focus_normalised_sum", None, reduce="sum")

    @staticmethod
    def _logs(geometry: AttentionGeometry, grid: tuple[int, int]) -> tuple[float, float]:
        """``(log N, log K)``: every token and the spatial tokens of ``grid``."""
        k = int(grid[0]) * int(grid[1])
        return math.log(geometry.num_prefix + k), math.log(k)

    @staticmethod
    def _normalised(x: torch.Tensor, log: float) -> torch.Tensor:
        return x / log if log > 0 else torch.zeros_like(x)

    @staticmethod
    def _sums(stats: list[BlockStats] | tuple[BlockStats, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        entropy = torch.stack([s.entropy.sum(dim=0) for s in stats]).to(torch.float64)
        focus = torch.stack([s.focus.sum(dim=0) for s in stats]).to(torch.float64)
        return entropy, focus

    def _update_blocks(self, geometry: AttentionGeometry, stats: list[BlockStats], batch: Batch) -> None:
        entropy, focus = self._sums(stats)
        self.entropy_sum, self.focus_sum = added(self.entropy_sum, entropy), added(self.focus_sum, focus)
        log_n, log_k = self._logs(geometry, batch.grid)
        self.entropy_normalised_sum = added(self.entropy_normalised_sum, self._normalised(entropy, log_n))
        self.focus_normalised_sum = added(self.focus_normalised_sum, self._normalised(focus, log_k))
        self.num_images += stats[0].batch_size

    def compute(self) -> AttentionFocusResult:
        meta = self._base_meta()
        if self.num_images == 0:
            return AttentionFocusResult(name=self.name, tensors={}, meta=meta)
        g, samples = self.geometry, self._cfg_random_samples
        names = ("entropy", "entropy_normalised", "focus", "focus_normalised")

        def random(grid: tuple[int, int]) -> torch.Tensor:  # [4, L, H]: the four quantities, in ``names`` order
            entropy, focus = (x / samples for x in self._sums(self._random(grid)))
            log_n, log_k = self._logs(g, grid)
            return torch.stack([entropy, self._normalised(entropy, log_n), focus, self._normalised(focus, log_k)])

        counts = self.grid_counts()
        n = self.num_images
        entropy, focus = self.entropy_sum / n, self.focus_sum / n
        if len(counts) == 1:  # one grid: normalise the means (as the sums per image would, to rounding)
            log_n, log_k = self._logs(g, counts[0][0])
            mine = (entropy, self._normalised(entropy, log_n), focus, self._normalised(focus, log_k))
        else:  # each image normalised by its own token counts
            mine = (entropy, self.entropy_normalised_sum / n, focus, self.focus_normalised_sum / n)
        tensors = dict(zip(names, mine))
        tensors.update(zip((f"random_{name}" for name in names), self.over_grids(random).unbind(0)))
        return AttentionFocusResult(name=self.name, tensors=tensors, meta=meta)
