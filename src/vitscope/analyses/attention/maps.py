"""Dataset and per-image attention maps per block and head: CLS maps and spatial-average maps.

Paper 002 figures 2 and 17 (dataset average, blocks x heads) and 11 to 13 (single images).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import torch

from vitscope.analyses.attention.base import AttentionAccumulator, AttentionGeometry, ChosenImages, grid_key
from vitscope.analyses.base import Batch, Figure, Result
from vitscope.analyses.registry import register_analysis
from vitscope.analyses.result import ExplorerMaps
from vitscope.analyses.state import added
from vitscope.functional.attention_blocks import BlockStats
from vitscope.viz.labels import sentence_case

__all__ = ["AttentionMapsResult", "CLSAttentionMaps", "SpatialAverageMaps"]


def _renormalise(x: torch.Tensor) -> torch.Tensor:
    s = x.sum(dim=-1, keepdim=True)
    return x / torch.where(s == 0, torch.ones_like(s), s)


class AttentionMapsResult(Result):
    """Result of :class:`CLSAttentionMaps` / :class:`SpatialAverageMaps`: blocks x heads grids of maps."""

    DIMS = {"*mean_map": ("block", "head", "row", "column"), "*mean_map@*": ("block", "head", "row", "column"),
            "image_maps*": ("image", "block", "head", "row", "column"), "images*": ("image", "y", "x", "channel")}

    def _mean_text(self) -> tuple[str, str]:
        """The caption and paper figure of the dataset-average maps (the figure and the explorer)."""
        if self.base_name == "cls_attention_maps":
            return ("Dataset-average CLS attention maps: rows are blocks, columns heads.",
                    "paper 002, fig. 2 and 17")
        return ("Dataset-average spatial-average attention maps: rows are blocks, columns heads.",
                "paper 002, fig. 17 (models without CLS)")

    def figures(self) -> list[Figure]:
        """``<name>_mean`` (dataset map), ``<name>_random`` and ``<name>_image<i>``: blocks x heads grids."""
        if "mean_map" not in self.tensors:
            return []
        what, n, labels = self.meta.get("what", self.name), self.meta.get("num_images", 0), self.meta.get("blocks")

        def grid(maps: torch.Tensor, title: str, image: torch.Tensor | None = None):
            def draw(path: Path) -> list[Path]:
                from vitscope.viz.attention_maps import block_head_maps

                return block_head_maps(maps, title, path, block_labels=labels, image=image)
            return draw

        figures = [
            self.figure("_mean", grid(self.tensors["mean_map"], f"{what}, mean over {n} images"), *self._mean_text()),
            self.figure("_random", grid(self.tensors["random_mean_map"], f"{what}, random-attention baseline"),
                        "The same maps for random attention (the baseline every map is compared with).",
                        "paper 002, fig. 17 (baseline)"),
        ]
        for key, count in list(self.meta.get("grids", {}).items())[1:]:  # images of the other token grids
            figures.append(self.figure(f"_mean_grid{key}", grid(self.tensors[f"mean_map@{key}"],
                                                                f"{what}, mean over {count} images of grid {key}"),
                                       f"{self._mean_text()[0]} Images whose token grid is {key} ({count}).",
                                       self._mean_text()[1], title=f"{sentence_case(what)}: grid {key}"))
        groups = [("", self.meta)] + [(f"@{key}", group) for key, group in self.meta.get("other_grids", {}).items()]
        for suffix, group in groups:
            indices = group.get("image_indices", [])
            names = group.get("image_names") or [f"image {i}" for i in indices]
            for j, (idx, name) in enumerate(zip(indices, names)):
                image = self.tensors[f"images{suffix}"][j] if f"images{suffix}" in self.tensors else None
                figures.append(self.figure(f"_image{idx}", grid(self.tensors[f"image_maps{suffix}"][j],
                                                                f"{what}, {name}", image),
                                           f"{sentence_case(what)} maps of {name} (image {idx}), every block and "
                                           "head.", "paper 002, fig. 11 to 13",
                                           title=f"{sentence_case(what)} maps: {name}"))
        return figures

    def explorer_maps(self) -> ExplorerMaps | None:
        """The dataset-average maps and those of the chosen images, for the report's block x head explorer."""
        if "mean_map" not in self.tensors or self.tensors["mean_map"].dim() != 4:
            return None
        indices = list(self.meta.get("image_indices", []))
        caption, paper = self._mean_text()
        return ExplorerMaps(self.tensors["mean_map"], self.meta.get("what", self.name), self.meta.get("blocks"),
                            self.tensors.get("image_maps"), self.tensors.get("images"),
                            list(self.meta.get("image_names") or [f"image {i}" for i in indices]), caption, paper,
                            (f"{self.name}_mean", *(f"{self.name}_image{i}" for i in indices)))


class _MapAccumulator(ChosenImages, AttentionAccumulator):
    """Sum over images of a per-image ``[L, H, h, w]`` map, plus the maps of chosen images.

    Args:
        images: dataset indices whose own maps (and preprocessed image, for display) are kept.
        seed, random_samples, random_kind: random baseline (see :class:`AttentionAccumulator`).

    State: ``num_images``, ``geometry``, ``map_sum`` ``[L, H, h, w]`` float64 (CPU), ``image_maps`` and
    ``image_pixels`` (dataset index -> ``[L, H, h, w]`` float64 / ``[H_px, W_px, 3]`` uint8).

    Result tensors: ``mean_map`` ``[L, H, h, w]``, ``random_mean_map`` ``[L, H, h, w]`` (the same map of
    the random baseline, mean over its samples), ``image_maps`` ``[I, L, H, h, w]`` and ``images``
    ``[I, H_px, W_px, 3]`` for the chosen images that were seen (sorted by index; absent when none).
    meta: ``num_images``, ``blocks``, ``num_heads``, ``grid``, ``num_prefix``, ``image_indices``, ``random``.
    """

    what: ClassVar[str] = "attention map"

    def __init__(self, images: Sequence[int] = (0, 1, 2, 3), seed: int = 0, random_samples: int = 4,
                 random_kind: str = "uniform") -> None:
        if isinstance(images, int):
            images = (images,)
        self._cfg_images: frozenset[int] = frozenset(int(i) for i in images)
        super().__init__(seed=seed, random_samples=random_samples, random_kind=random_kind)

    def _declare_sums(self) -> None:
        self.add_state("map_sum", {}, reduce="sum")  # "HxW" grid -> [L, H, h, w] float64
        self._declare_chosen()

    @abstractmethod
    def _maps(self, stats: BlockStats) -> torch.Tensor:
        """Per-image map ``[B, H, K]`` of one block."""

    def _update_blocks(self, geometry: AttentionGeometry, stats: list[BlockStats], batch: Batch) -> None:
        h, w = batch.grid
        maps = torch.stack([self._maps(s) for s in stats], dim=1)  # [B, L, H, K]
        maps = maps.reshape(*maps.shape[:3], h, w)
        key = grid_key(batch.grid)
        self.map_sum[key] = added(self.map_sum.get(key), maps.sum(dim=0).to(torch.float64))
        self.num_images += maps.shape[0]
        self._keep_chosen(batch, maps)

    def compute(self) -> AttentionMapsResult:
        meta = {"what": self.what, **self._base_meta(), "image_indices": sorted(self.image_maps),
                "image_names": self._chosen_names()}
        if self.num_images == 0:
            return AttentionMapsResult(name=self.name, tensors={}, meta=meta)
        tensors: dict[str, torch.Tensor] = {}
        for j, (grid, n) in enumerate(self.grid_counts()):  # the main grid's maps under the plain names
            suffix = "" if j == 0 else f"@{grid_key(grid)}"
            rand = torch.stack([self._maps(s).mean(dim=0) for s in self._random(grid)])
            tensors[f"mean_map{suffix}"] = self.map_sum[grid_key(grid)] / n
            tensors[f"random_mean_map{suffix}"] = rand.reshape(-1, self.geometry.num_heads, *grid).to(
                torch.float64).cpu()
        chosen_meta, chosen = self._chosen_by_grid(self.main_grid())
        meta.update(chosen_meta)
        tensors.update(chosen)
        return AttentionMapsResult(name=self.name, tensors=tensors, meta=meta)


@register_analysis("cls_attention_maps", groups=("attention",), order=30)
class CLSAttentionMaps(_MapAccumulator):
    """CLS attention maps: row 0 of every head over the spatial keys, raw (docs/methods.md, Attention).

    Dataset map = sum over images / number of images. Needs a CLS token. See :class:`_MapAccumulator`
    for arguments, state and result.
    """

    description = ("Where the CLS token looks: its attention over the image patches, for every head of every block, "
                   "averaged over the dataset and for single images.")
    summary = "CLS attention maps"

    NEEDS = frozenset({"cls"})
    requires_cls = True
    what = "CLS attention"

    def _maps(self, stats: BlockStats) -> torch.Tensor:
        return stats.cls


@register_analysis("spatial_average_maps", groups=("attention",), order=40)
class SpatialAverageMaps(_MapAccumulator):
    """Spatial-average maps: the raw rows of the spatial queries over the spatial keys, summed, normalised.

    Per image and head the map sums to 1 (docs/methods.md, Attention; a map summing to 0 stays 0); the dataset
    map is the mean over images. Works without a CLS token. See :class:`_MapAccumulator`.
    """

    description = ("Where the image tokens look on average: the attention of all spatial queries summed over "
                   "queries and normalised, per head and block (works without a CLS token).")
    summary = "spatial-average attention maps"

    NEEDS = frozenset({"colsum"})
    what = "spatial-average attention"

    def _maps(self, stats: BlockStats) -> torch.Tensor:
        return _renormalise(stats.colsum)
