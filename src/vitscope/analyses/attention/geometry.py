"""Where heads look relative to the query: aligned aggregated attention maps (AAAM) with the local-head
taxonomy and offsets (paper 002 figures 3 and 18), and the average attention distance (figure 4)."""

from __future__ import annotations

from pathlib import Path

import torch

from vitscope.analyses.attention.base import AttentionAccumulator, AttentionGeometry, grid_key
from vitscope.analyses.base import Batch, Figure, Result
from vitscope.analyses.registry import register_analysis
from vitscope.analyses.state import added
from vitscope.functional.attention_blocks import BlockStats, grid_tables
from vitscope.functional.attention_geometry import HEAD_TYPES, aligned_offset, local_head_type
from vitscope.viz.charts import block_lines_chart, curve

__all__ = ["AlignedAttention", "AlignedAttentionResult", "AttentionDistance", "AttentionDistanceResult"]


class AlignedAttentionResult(Result):
    """Result of :class:`AlignedAttention`: the AAAM grid, a per-head table and the table of offset heads."""

    DIMS = {"*aaam": ("block", "head", "dy", "dx"), "*aaam@*": ("block", "head", "dy", "dx"),
            "offset": ("block", "head", "axis"),
            "peak": ("block", "head", "axis"), "*": ("block", "head")}

    def head_table(self):
        """One row per block and head: type, peak offset (cells), centre-of-mass offset and its norm."""
        import pandas as pd

        if "aaam" not in self.tensors:
            return pd.DataFrame()
        rows = []
        types, blocks = self.meta["head_types"], self.meta["blocks"]
        peak, offset, norm = self.tensors["peak"], self.tensors["offset"], self.tensors["offset_norm"]
        centre = self.tensors["centre_mass"]
        for i, block in enumerate(blocks):
            for h in range(peak.shape[1]):
                rows.append({"block": block, "head": h, "type": types[i][h], "peak_dy": int(peak[i, h, 0]),
                             "peak_dx": int(peak[i, h, 1]), "offset_dy": float(offset[i, h, 0]),
                             "offset_dx": float(offset[i, h, 1]), "offset_norm": float(norm[i, h]),
                             "centre_mass": float(centre[i, h])})
        return pd.DataFrame(rows)

    def tables(self) -> dict:
        """The long table plus ``<name>_heads`` (every head's type and offsets) and ``<name>_offset_heads``."""
        table = self.head_table()
        offsets = table[table["type"] == "offset_local"] if len(table) else table
        return {**super().tables(), f"{self.name}_heads": table, f"{self.name}_offset_heads": offsets}

    def figures(self) -> list[Figure]:
        """``<name>``: the blocks x heads AAAM grid, labelled with head types."""
        if "aaam" not in self.tensors:
            return []
        n = self.meta.get("num_images", 0)

        def draw(path: Path) -> list[Path]:
            from vitscope.viz.attention_maps import aligned_maps_figure

            return aligned_maps_figure(self.tensors["aaam"], self.meta["head_types"],
                                       f"Aligned aggregated attention maps, mean over {n} images", path,
                                       block_labels=self.meta.get("blocks"))

        return [self.figure("", draw, "Aligned aggregated attention maps per block and head; a bright centre marks a "
                            "local head, an off-centre peak an offset-local head.",
                            "paper 002, fig. 3 and 18 (offset heads: fig. 14)")]


@register_analysis("aligned_attention", groups=("attention",), order=50)
class AlignedAttention(AttentionAccumulator):
    """Dataset aligned aggregated attention map (AAAM) of every block and head, with its head taxonomy.

    Per image the AAAM is :func:`~vitscope.functional.aligned_attention` (every spatial query's spatial
    attention map placed so the query lands at the centre of a ``(2h-1) x (2w-1)`` canvas, mean over
    queries); the dataset AAAM is the mean over images. From it: the offset (centre of mass,
    :func:`~vitscope.functional.aligned_offset`) and the local-head type
    (:func:`~vitscope.functional.local_head_type`, thresholds below).

    Args:
        strict, offset, soft, axial, radius: taxonomy thresholds (docs/methods.md, Attention).
        seed, random_samples, random_kind: random baseline.

    State: ``num_images``, ``geometry``, ``aaam_sum`` ``[L, H, 2h-1, 2w-1]`` float64.

    Result tensors: ``aaam``, ``random_aaam`` ``[L, H, 2h-1, 2w-1]``; ``offset`` ``[L, H, 2]`` (dy, dx) and
    ``offset_norm`` ``[L, H]``; ``peak`` ``[L, H, 2]`` (cells from the centre, int64); ``centre_mass``
    ``[L, H]``; ``random_offset_norm`` ``[L, H]``. meta: ``head_types`` (``[L][H]`` labels),
    ``type_counts``, ``offset_heads`` (``[block, head, dy, dx]`` of every offset-local head),
    ``random_head_types``, ``thresholds`` and the geometry.
    """

    description = ("Aligned aggregated attention maps: every query's attention re-centred on the query and averaged, "
                   "so local heads show a bright centre and offset-local heads a shifted peak.")
    summary = "dataset-aligned attention map and head types"

    NEEDS = frozenset({"aligned"})

    def __init__(self, strict: float = 0.5, offset: float = 0.3, soft: float = 0.5, axial: float = 0.7,
                 radius: int = 2, seed: int = 0, random_samples: int = 4, random_kind: str = "uniform") -> None:
        self._cfg_thresholds = {"strict": float(strict), "offset": float(offset), "soft": float(soft),
                                "axial": float(axial), "radius": int(radius)}
        super().__init__(seed=seed, random_samples=random_samples, random_kind=random_kind)

    def _declare_sums(self) -> None:
        self.add_state("aaam_sum", {}, reduce="sum")  # "HxW" grid -> [L, H, 2h-1, 2w-1] float64

    def _canvas(self, stats: list[BlockStats]) -> torch.Tensor:
        sh, sw = grid_tables(stats[0].grid).canvas_shape
        return torch.stack([s.aligned for s in stats]).reshape(len(stats), -1, sh, sw)

    def _update_blocks(self, geometry: AttentionGeometry, stats: list[BlockStats], batch: Batch) -> None:
        key = grid_key(batch.grid)  # a canvas per grid shape: offsets of different grids are different cells
        self.aaam_sum[key] = added(self.aaam_sum.get(key), self._canvas(stats))
        self.num_images += stats[0].batch_size

    def compute(self) -> AlignedAttentionResult:
        """The main grid's maps, offsets and head types under the plain names; each other grid's maps as
        ``aaam@HxW`` / ``random_aaam@HxW`` and its head types as ``meta["other_grids"][HxW]``."""
        meta = {**self._base_meta(), "thresholds": dict(self._cfg_thresholds)}
        if self.num_images == 0:
            return AlignedAttentionResult(name=self.name, tensors={}, meta=meta)
        (main, n), *others = self.grid_counts()
        tensors: dict[str, torch.Tensor] = {}
        for grid, count in others:
            key = grid_key(grid)
            aaam = self.aaam_sum[key] / count
            tensors[f"aaam@{key}"] = aaam
            tensors[f"random_aaam@{key}"] = self._canvas(list(self._random(grid))) / self._cfg_random_samples
            meta.setdefault("other_grids", {})[key] = {"head_types": local_head_type(aaam, **self._cfg_thresholds)[0]}
        aaam = self.aaam_sum[grid_key(main)] / n
        random = self._canvas(list(self._random(main))) / self._cfg_random_samples
        offset, norm = aligned_offset(aaam)
        types, peak = local_head_type(aaam, **self._cfg_thresholds)
        random_types, _ = local_head_type(random, **self._cfg_thresholds)
        sh, sw = aaam.shape[-2:]
        centre = aaam[..., (sh - 1) // 2, (sw - 1) // 2] / aaam.sum(dim=(-2, -1)).clamp_min(1e-300)
        blocks = list(self.geometry.blocks)
        meta.update({
            "head_types": types,
            "type_counts": {t: sum(row.count(t) for row in types) for t in HEAD_TYPES},
            "offset_heads": [[blocks[i], h, int(peak[i, h, 0]), int(peak[i, h, 1])]
                             for i, row in enumerate(types) for h, t in enumerate(row) if t == "offset_local"],
            "random_head_types": random_types,
        })
        tensors = {"aaam": aaam, "random_aaam": random, "offset": offset, "offset_norm": norm, "peak": peak,
                   "centre_mass": centre, "random_offset_norm": aligned_offset(random)[1], **tensors}
        return AlignedAttentionResult(name=self.name, tensors=tensors, meta=meta)


class AttentionDistanceResult(Result):
    """Result of :class:`AttentionDistance`: paper 002 figure 4 for this model."""

    DIMS = {"*block_mean": ("block",), "*": ("block", "head")}

    def figures(self) -> list[Figure]:
        """``<name>``: the distance of every head per block, the per-block mean and the random baseline."""
        if "distance" not in self.tensors:
            return []
        model = self.meta.get("model") or "model"

        def draw(path: Path) -> list[Path]:
            from vitscope.viz.attention_figures import distance_figure

            return distance_figure({model: self.tensors["distance"]}, path, random=self.tensors["random_distance"],
                                   block_labels=self.meta.get("blocks"))

        t = self.tensors
        chart = block_lines_chart([curve(model, t["distance"].mean(-1), model),
                                   curve(model, t["distance"], model, "dots"),
                                   curve("random attention", t["random_distance"].mean(-1), "", "dashed")],
                                  "attention distance (unit square)", t["distance"].shape[0],
                                  self.meta.get("blocks"), "Average attention distance")
        return [self.figure("", draw, "Average attention distance of every head per block (dots), the per-block "
                            "mean (line) and random attention (dashed).", "paper 002, fig. 4 and 15", chart=chart)]


@register_analysis("attention_distance", groups=("attention",), order=60)
class AttentionDistance(AttentionAccumulator):
    """Average attention distance per block and head (Raghu et al.; paper 002 section 4.3, figure 4).

    Per image and head :func:`~vitscope.functional.attention_distance` (unit-square positions, mean over
    spatial queries of the attention-weighted distance to the keys); dataset value = mean over images.
    Computed from the per-image aligned map: a key's distance from its query depends only on their
    offset, so ``d = sum_cells AAAM[cell] * ||offset(cell)||`` exactly.

    State: ``num_images``, ``geometry``, ``distance_sum`` ``[L, H]`` float64.

    Result tensors: ``distance`` ``[L, H]``, ``block_mean`` ``[L]``, ``random_distance`` ``[L, H]``,
    ``random_block_mean`` ``[L]``. meta: the geometry, ``num_images``, ``random``.
    """

    description = ("Average attention distance: how far each head looks from its query (token centres on the unit "
                   "square: the grid spans 1 on each axis). Local processing has small distances, global processing "
                   "large ones.")
    summary = "mean attention distance (unit square)"

    NEEDS = frozenset({"aligned"})

    def _declare_sums(self) -> None:
        self.add_state("distance_sum", None, reduce="sum")  # [L, H] float64

    @staticmethod
    def _distance(stats: list[BlockStats]) -> torch.Tensor:
        """``[L, H]`` sum over the batch's images of the per-image distance."""
        dist = grid_tables(stats[0].grid, stats[0].aligned.device).cell_distance
        return torch.stack([s.aligned @ dist for s in stats])

    def _update_blocks(self, geometry: AttentionGeometry, stats: list[BlockStats], batch: Batch) -> None:
        d = self._distance(stats)
        self.distance_sum = added(self.distance_sum, d)
        self.num_images += stats[0].batch_size

    def compute(self) -> AttentionDistanceResult:
        meta = self._base_meta()
        if self.num_images == 0:
            return AttentionDistanceResult(name=self.name, tensors={}, meta=meta)
        distance = self.distance_sum / self.num_images
        random = self.over_grids(lambda grid: self._distance(list(self._random(grid))) / self._cfg_random_samples)
        tensors = {"distance": distance, "block_mean": distance.mean(dim=-1), "random_distance": random,
                   "random_block_mean": random.mean(dim=-1)}
        return AttentionDistanceResult(name=self.name, tensors=tensors, meta=meta)
