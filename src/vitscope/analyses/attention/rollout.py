"""Attention rollout (Abnar & Zuidema) for chosen images and averaged over the dataset."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from vitscope.analyses.attention.base import AttentionAccumulator, AttentionGeometry, ChosenImages
from vitscope.analyses.base import Batch, Figure, Result
from vitscope.analyses.registry import register_analysis
from vitscope.functional.attention_blocks import FUSIONS, BlockStats
from vitscope.functional.rollout import rollout

__all__ = ["AttentionRollout", "AttentionRolloutResult"]


class AttentionRolloutResult(Result):
    """Result of :class:`AttentionRollout`: the rollout maps over the chosen images."""

    def figures(self) -> list[Figure]:
        """``<name>``: the chosen images with their rollout overlaid, the dataset and random maps."""
        if "mean_map" not in self.tensors:
            return []

        def draw(path: Path) -> list[Path]:
            from vitscope.viz.attention_figures import rollout_figure

            return rollout_figure(self.tensors.get("images"), self.tensors.get("image_maps"),
                                  self.meta.get("image_indices", []), self.tensors["mean_map"],
                                  self.tensors["random_map"], f"Attention rollout ({self.meta.get('head_fusion')} "
                                  f"over heads), {self.meta.get('num_images', 0)} images", path)

        return [self.figure("", draw, "Attention rollout maps (dataset mean and single images).",
                            "paper 000, section 3.2 (rollout redistribution)")]


@register_analysis("attention_rollout", groups=("attention",))
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


    def __init__(self, head_fusion: str = "mean", discard_ratio: float = 0.0, exclude_prefix: bool = False,
                 images: Sequence[int] = (0, 1, 2, 3), seed: int = 0, random_samples: int = 4,
                 random_kind: str = "uniform") -> None:
        if head_fusion not in FUSIONS:
            raise ValueError(f"head_fusion must be one of {FUSIONS}, got {head_fusion!r}")
        if not 0.0 <= float(discard_ratio) < 1.0:
            raise ValueError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
        if isinstance(images, int):
            images = (images,)
        self._cfg_head_fusion = head_fusion
        self._cfg_discard_ratio = float(discard_ratio)
        self._cfg_exclude_prefix = bool(exclude_prefix)
        self._cfg_images: frozenset[int] = frozenset(int(i) for i in images)
        super().__init__(seed=seed, random_samples=random_samples, random_kind=random_kind)

    def own_needs(self) -> frozenset[str]:
        return frozenset({f"fused_{self._cfg_head_fusion}"})

    def _declare_sums(self) -> None:
        self.add_state("rollout_sum", None, reduce="sum")  # [N', N'] float64
        self.add_state("map_sum", None, reduce="sum")  # [h, w] float64
        self._declare_chosen()

    def _uses_cls(self, geometry: AttentionGeometry) -> bool:
        return geometry.has_cls and not self._cfg_exclude_prefix

    def _rollout(self, stats: Sequence[BlockStats], geometry: AttentionGeometry) -> tuple[torch.Tensor, torch.Tensor]:
        """``(R [B, N', N'], display maps [B, h, w])`` from the blocks' head-fused maps."""
        fused = [s.fused[self._cfg_head_fusion].unsqueeze(1) for s in stats]  # [B, 1, N, N]: fusion already done
        p = geometry.num_prefix
        r = rollout(fused, "mean", self._cfg_discard_ratio, num_prefix=p if self._cfg_exclude_prefix else None)
        q0 = 0 if self._cfg_exclude_prefix else p  # first spatial token of R
        if self._uses_cls(geometry):
            maps = r[:, 0, q0:]
        else:
            maps = r[:, q0:, q0:].sum(dim=1)
        s = maps.sum(dim=-1, keepdim=True)
        maps = maps / torch.where(s == 0, torch.ones_like(s), s)
        return r, maps.reshape(-1, *geometry.grid)

    def _update_blocks(self, geometry: AttentionGeometry, stats: list[BlockStats], batch: Batch) -> None:
        r, maps = self._rollout(stats, geometry)
        r_sum, m_sum = r.sum(dim=0).to(torch.float64).cpu(), maps.sum(dim=0).to(torch.float64).cpu()
        if self.rollout_sum is None:
            self.rollout_sum, self.map_sum = r_sum, m_sum
        else:
            self.rollout_sum, self.map_sum = self.rollout_sum + r_sum, self.map_sum + m_sum
        self.num_images += r.shape[0]
        self._keep_chosen(batch, maps)

    def compute(self) -> AttentionRolloutResult:
        meta = {**self._base_meta(), "head_fusion": self._cfg_head_fusion, "discard_ratio": self._cfg_discard_ratio,
                "exclude_prefix": self._cfg_exclude_prefix, "image_indices": sorted(self.image_maps)}
        if self.num_images == 0:
            return AttentionRolloutResult(name=self.name, tensors={}, meta=meta)
        meta["map_source"] = "cls" if self._uses_cls(self.geometry) else "spatial_average"
        _, random_maps = self._rollout(self._random(), self.geometry)
        tensors = {"mean_rollout": self.rollout_sum / self.num_images, "mean_map": self.map_sum / self.num_images,
                   "random_map": random_maps.mean(dim=0).to(torch.float64)}
        tensors.update(self._chosen_tensors())
        return AttentionRolloutResult(name=self.name, tensors=tensors, meta=meta)
