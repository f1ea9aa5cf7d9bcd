"""Attention rollout (Abnar & Zuidema) for chosen images and averaged over the dataset."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from vitscope.analyses.attention.base import (
    PATTERN_HOOKS,
    AttentionAccumulator,
    AttentionGeometry,
    ChosenImages,
    grid_key,
)
from vitscope.analyses.base import Batch, Figure, Result
from vitscope.analyses.batch import recorded_patterns
from vitscope.analyses.registry import register_analysis
from vitscope.analyses.state import added
from vitscope.errors import VitscopeValueError
from vitscope.functional.attention_blocks import FUSIONS, BlockStats, random_patterns
from vitscope.functional.rollout import fuse_heads, rollout_step
from vitscope.models.spec import ModelSpec

__all__ = ["AttentionRollout", "AttentionRolloutResult"]


class AttentionRolloutResult(Result):
    """Result of :class:`AttentionRollout`: the rollout maps over the chosen images."""

    DIMS = {"mean_rollout*": ("query", "key"), "*_map": ("row", "column"), "*_map@*": ("row", "column"),
            "image_maps*": ("image", "row", "column"), "images*": ("image", "y", "x", "channel")}

    def figures(self) -> list[Figure]:
        """``<name>``: the chosen images with their rollout overlaid, the dataset and random maps; with images of
        several token grids, ``<name>_grid<HxW>`` for each other grid."""
        if "mean_map" not in self.tensors:
            return []
        grids = list(self.meta.get("grids", {}).items())
        others = self.meta.get("other_grids", {})
        groups = [("", "", self.meta, grids[0][1] if grids else self.meta.get("num_images", 0))]
        groups += [(f"@{key}", f"_grid{key}", others.get(key, {}), n) for key, n in grids[1:]]
        figures = []
        for suffix, stem, group, count in groups:
            where = f" of grid {suffix[1:]}" if suffix else ""

            def draw(path: Path, suffix=suffix, group=group, count=count, where=where) -> list[Path]:
                from vitscope.viz.attention_maps import rollout_figure

                return rollout_figure(self.tensors.get(f"images{suffix}"), self.tensors.get(f"image_maps{suffix}"),
                                      group.get("image_names") or group.get("image_indices", []),
                                      self.tensors[f"mean_map{suffix}"], self.tensors[f"random_map{suffix}"],
                                      f"Attention rollout ({self.meta.get('head_fusion')} over heads), {count} "
                                      f"images{where}", path)

            figures.append(self.figure(stem, draw, f"Attention rollout maps (dataset mean and single images){where}.",
                                       "paper 000, section 3.2 (rollout redistribution)"))
        return figures


@register_analysis("attention_rollout", groups=("attention",), order=90)
class AttentionRollout(ChosenImages, AttentionAccumulator):
    """Attention rollout of every image (:func:`~vitscope.functional.rollout`), its display map, and means.

    ``R = A_hat_L @ ... @ A_hat_1`` over the recorded blocks in order (first block first), heads fused by
    ``head_fusion``, optional ``discard_ratio``, ``A_hat = (A + I)`` row-normalised. The display map of an
    image is the CLS row of ``R`` over the spatial tokens, normalised to sum 1; for models without a CLS
    token, or with ``exclude_prefix``, it is the spatial-average map of ``R`` (its spatial query rows over
    the spatial keys, summed, normalised).

    Args:
        head_fusion: ``"mean"`` (default), ``"max"`` or ``"min"``.
        discard_ratio: fraction in ``[0, 1)`` of the smallest fused entries zeroed per image (default 0).
        exclude_prefix: roll out the spatial attention only (prefix tokens dropped, rows renormalised).
        images: dataset indices whose own maps (and preprocessed image) are kept.
        seed, random_samples, random_kind: random baseline.

    State: ``num_images``, ``geometry``, ``rollout_sum`` ``[N', N']`` and ``map_sum`` ``[h, w]`` float64,
    ``image_maps`` / ``image_pixels`` of the chosen images.

    Result tensors: ``mean_rollout`` ``[N', N']`` (``N' = N``, or ``K`` with ``exclude_prefix``),
    ``mean_map`` ``[h, w]``, ``random_map`` ``[h, w]``, ``image_maps`` ``[I, h, w]`` and ``images``
    ``[I, H_px, W_px, 3]`` (when chosen images were seen). meta: ``head_fusion``, ``discard_ratio``,
    ``exclude_prefix``, ``map_source`` (``"cls"`` or ``"spatial_average"``), ``image_indices``, geometry.
    """

    description = ("Attention rollout: attention propagated through the residual stream from the input patches to "
                   "the output, averaged over the dataset and for single images.")
    summary = "attention rollout maps"


    def __init__(self, head_fusion: str = "mean", discard_ratio: float = 0.0, exclude_prefix: bool = False,
                 images: Sequence[int] = (0, 1, 2, 3), seed: int = 0, random_samples: int = 4,
                 random_kind: str = "uniform") -> None:
        if head_fusion not in FUSIONS:
            raise VitscopeValueError(f"head_fusion must be one of {FUSIONS}, got {head_fusion!r}")
        if not 0.0 <= float(discard_ratio) < 1.0:
            raise VitscopeValueError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
        if isinstance(images, int):
            images = (images,)
        self._cfg_head_fusion = head_fusion
        self._cfg_discard_ratio = float(discard_ratio)
        self._cfg_exclude_prefix = bool(exclude_prefix)
        self._cfg_images: frozenset[int] = frozenset(int(i) for i in images)
        super().__init__(seed=seed, random_samples=random_samples, random_kind=random_kind)

    def own_needs(self) -> frozenset[str]:
        return frozenset()  # the product is folded block by block in update_hook

    def stream_hooks(self, spec: ModelSpec) -> list[str]:
        return [PATTERN_HOOKS]

    def update_hook(self, name: str, pattern: torch.Tensor, batch: Batch) -> None:
        """Fold one block into the batch's rollout (one ``[B, N', N']`` product held, not every pattern)."""
        dtype = torch.float64 if pattern.dtype == torch.float64 else torch.float32
        fused = fuse_heads(pattern.detach().to(dtype), self._cfg_head_fusion)
        scratch = self.per_batch(batch)
        scratch["rollout"] = self._step(scratch.get("rollout"), fused, batch.spec.num_prefix_tokens)

    def _step(self, result: torch.Tensor | None, fused: torch.Tensor, num_prefix: int) -> torch.Tensor:
        """``result`` with one more block (``fused`` ``[B, N, N]``) folded in."""
        prefix = int(num_prefix) if self._cfg_exclude_prefix else None
        return rollout_step(result, fused, self._cfg_discard_ratio, prefix)

    def update(self, record: Mapping[str, torch.Tensor], batch: Batch) -> None:
        if "rollout" not in self.per_batch(batch):  # not fed by the engine: read the record's patterns now
            for _, key in recorded_patterns(record):
                self.update_hook(key, record[key], batch)
        super().update(record, batch)

    def _declare_sums(self) -> None:
        self.add_state("rollout_sum", {}, reduce="sum")  # "HxW" grid -> [N', N'] float64
        self.add_state("map_sum", {}, reduce="sum")  # "HxW" grid -> [h, w] float64
        self._declare_chosen()

    def _uses_cls(self, geometry: AttentionGeometry) -> bool:
        return geometry.has_cls and not self._cfg_exclude_prefix

    def _maps(self, r: torch.Tensor, geometry: AttentionGeometry, grid: tuple[int, int]) -> torch.Tensor:
        """Display maps ``[B, h, w]`` of the rollouts ``r`` ``[B, N', N']`` of ``grid``."""
        p = geometry.num_prefix
        q0 = 0 if self._cfg_exclude_prefix else p  # first spatial token of R
        if self._uses_cls(geometry):
            maps = r[:, 0, q0:]
        else:
            maps = r[:, q0:, q0:].sum(dim=1)
        s = maps.sum(dim=-1, keepdim=True)
        maps = maps / torch.where(s == 0, torch.ones_like(s), s)
        return maps.reshape(-1, *grid)

    def _update_blocks(self, geometry: AttentionGeometry, stats: list[BlockStats], batch: Batch) -> None:
        r = self.per_batch(batch)["rollout"]
        maps = self._maps(r, geometry, batch.grid)
        key = grid_key(batch.grid)
        self.rollout_sum[key] = added(self.rollout_sum.get(key), r.sum(dim=0).to(torch.float64))
        self.map_sum[key] = added(self.map_sum.get(key), maps.sum(dim=0).to(torch.float64))
        self.num_images += r.shape[0]
        self._keep_chosen(batch, maps)

    def compute(self) -> AttentionRolloutResult:
        meta = {**self._base_meta(), "head_fusion": self._cfg_head_fusion, "discard_ratio": self._cfg_discard_ratio,
                "exclude_prefix": self._cfg_exclude_prefix, "image_indices": sorted(self.image_maps),
                "image_names": self._chosen_names()}
        if self.num_images == 0:
            return AttentionRolloutResult(name=self.name, tensors={}, meta=meta)
        meta["map_source"] = "cls" if self._uses_cls(self.geometry) else "spatial_average"
        g, tensors = self.geometry, {}
        for k, (grid, n) in enumerate(self.grid_counts()):  # the main grid's under the plain names
            suffix, key = ("" if k == 0 else f"@{grid_key(grid)}"), grid_key(grid)
            r = None
            for pattern in random_patterns(self._cfg_seed, self._cfg_random_kind, self._cfg_random_samples,
                                           len(g.blocks), g.num_heads, grid, g.num_prefix):
                r = self._step(r, fuse_heads(pattern, self._cfg_head_fusion), g.num_prefix)
            tensors.update({f"mean_rollout{suffix}": self.rollout_sum[key] / n,
                            f"mean_map{suffix}": self.map_sum[key] / n,
                            f"random_map{suffix}": self._maps(r, g, grid).mean(dim=0).to(torch.float64)})
        chosen_meta, chosen = self._chosen_by_grid(self.main_grid())
        meta.update(chosen_meta)
        tensors.update(chosen)
        return AttentionRolloutResult(name=self.name, tensors=tensors, meta=meta)
