"""Saliency IoU of attention maps with ground-truth masks (paper 002 section 4.4, figure 5).

For every block and head, the CLS map (and the spatial-average map) of each image is thresholded to the
smallest set of tokens holding ``mass`` (60%) of it and compared with the union of the image's instance
masks on the token grid (docs/methods.md, Attention, "Saliency IoU").
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from vitscope.analyses.attention.base import AttentionAccumulator, AttentionGeometry
from vitscope.analyses.base import Batch, Figure, Result
from vitscope.analyses.registry import register_analysis
from vitscope.analyses.state import added
from vitscope.errors import VitscopeValueError
from vitscope.functional.attention import mass_mask
from vitscope.functional.attention_blocks import BlockStats
from vitscope.models.preprocess import resize_crop
from vitscope.models.spec import ModelSpec
from vitscope.viz.charts import Chart, block_lines_chart, curve
from vitscope.viz.ranges import quantity_range

__all__ = ["SaliencyIoU", "SaliencyIoUResult", "mask_to_grid"]

BEST_HEAD_RULES: tuple[str, ...] = ("image", "dataset")


def mask_to_grid(masks: np.ndarray | Sequence[np.ndarray], spec: ModelSpec, grid: Sequence[int],
                 frame: Callable[..., Image.Image] | None = None) -> np.ndarray:
    """Ground truth on the token grid: union of the instance masks after the image's geometry.

    Each ``[H, W]`` instance mask becomes a uint8 0/255 image, goes through the image's own resize and
    centre crop (:func:`~vitscope.models.preprocess.resize_crop` with ``spec.interpolation``, as the
    pixels; under a view, the view's geometry), is resized to the ``h x w`` grid with PIL's bicubic filter and
    thresholded at > 0; the union over instances is returned (docs/methods.md, Attention).

    Args:
        masks: ``[n, H, W]`` bool (or 0/1) instance masks at the image's original size; ``n`` may be 0.
        spec: the model's ModelSpec (its ``image_size``, ``resize_size`` and ``interpolation``).
        grid: ``(h, w)`` token grid.
        frame: the run's view's geometry (``Batch.frame``); None: the model's own resize and crop.

    Returns:
        ``[h, w]`` bool.
    """
    h, w = (int(v) for v in grid)
    out = np.zeros((h, w), dtype=bool)
    for m in np.asarray(masks):
        img = Image.fromarray(np.where(np.asarray(m) > 0, 255, 0).astype(np.uint8), mode="L")
        img = (resize_crop(img, spec) if frame is None else frame(img, None)).resize((w, h), Image.Resampling.BICUBIC)
        out |= np.asarray(img) > 0
    return out


#: the target the loading thread fills with ``(grid, mask_to_grid(masks))`` per image
MASK_GRID = "saliency_mask_grid"


def _grid_of_masks(masks: Any, spec: ModelSpec, grid: tuple[int, int]) -> tuple[tuple[int, int], np.ndarray]:
    return tuple(grid), mask_to_grid(masks, spec, grid)


class SaliencyIoUResult(Result):
    """Result of :class:`SaliencyIoU`: figure 5 (best-head IoU per block vs random) and per-head heatmaps."""

    DIMS = {"*_best_iou*": ("block",), "*_best_head_dataset": ("block",), "*_most_often_best": ("block",),
            "*": ("block", "head")}

    def figures(self) -> list[Figure]:
        """``<name>``: best-head IoU per block per map (random dashed), and ``<name>_<source>_heads`` heatmaps."""
        sources = [s for s in self.meta.get("sources", []) if f"{s}_iou" in self.tensors]
        if not sources:
            return []
        model, labels = self.meta.get("model") or "model", self.meta.get("blocks")

        def curves(path: Path) -> list[Path]:
            from vitscope.viz.attention_figures import saliency_figure

            return saliency_figure({model: {s: self.tensors[f"{s}_best_iou"] for s in sources}},
                                   {s: self.tensors[f"random_{s}_best_iou"] for s in sources}, path,
                                   block_labels=labels, rule=self.meta.get("best_head", "image"))

        rule = "mean of per-image max" if self.meta.get("best_head", "image") == "image" else "best dataset head"
        names = {"cls": "CLS attention", "spatial": "spatial-average attention"}
        panels = []
        for s in sources:
            best = self.tensors[f"{s}_best_iou"]
            panels += block_lines_chart([curve(model, best, model),
                                         curve("random attention", self.tensors[f"random_{s}_best_iou"], "", "dashed")],
                                        f"best-head IoU ({rule})", best.shape[0], labels, names.get(s, s),
                                        y_range=quantity_range("iou")).panels
        n = self.meta.get("num_images", 0)
        return [self.figure("", curves, "Best-head saliency IoU per block against the object masks, with random "
                            "attention.", "paper 002, fig. 5 and 16", title="Saliency IoU per block",
                            chart=Chart(panels))] + [
            self.heatmap_figure(f"_{s}_heads", self.tensors[f"{s}_iou"], f"Saliency IoU of the {names.get(s, s)} "
                                f"map per head ({n} images)", "mean IoU", f"Saliency IoU of every head per block "
                                f"({names.get(s, s)} map).",
                                "paper 002, fig. 16", block_labels=labels, quantity=f"{s}_iou") for s in sources]


@register_analysis("saliency_iou", groups=("attention",), order=70)
class SaliencyIoU(AttentionAccumulator):
    """IoU of the mass-thresholded CLS and spatial-average maps with the ground-truth masks.

    Reads ``batch.targets["masks"]``: one ``[n, H, W]`` array of instance masks per image (the format
    readers' ``AnnotatedImage.masks``), mapped to the grid by :func:`mask_to_grid`. Images whose union
    mask is empty on the grid have no salient object and are skipped (counted in ``num_empty``). The CLS
    source needs a CLS token; models without one get the spatial-average source only.

    Best head of a block (``best_head``): ``"image"`` (default, the 002 code's rule) = mean over images of
    the maximum over heads; ``"dataset"`` = the single head with the highest dataset-mean IoU. Both are
    reported; ``<src>_best_iou`` follows the option. Also reported: how often each head is the best one
    of an image, and the head that is best most often.

    Random baseline: the maps of the run's random patterns (seeded, ``random_samples`` per block) against
    every image's ground truth, averaged over the samples.

    Args:
        mass: fraction of the map's mass kept by the threshold, in ``(0, 1]``.
        best_head: ``"image"`` or ``"dataset"``.
        seed, random_samples, random_kind: random baseline.

    State per source (``cls``, ``spatial``): ``iou_sum`` ``[L, H]``, ``best_sum`` ``[L]``, ``best_count``
    ``[L, H]``, ``random_iou_sum`` ``[L, H]``, ``random_best_sum`` ``[L]`` (float64), plus ``num_images``,
    ``num_empty`` and the geometry.

    Result tensors per source ``s``: ``s_iou`` ``[L, H]`` (mean over images), ``s_best_iou`` ``[L]`` (by the
    option), ``s_best_iou_image`` ``[L]``, ``s_best_iou_dataset`` ``[L]``, ``s_best_head_dataset`` ``[L]``,
    ``s_best_head_count`` ``[L, H]``, ``s_most_often_best`` ``[L]``, ``random_s_iou`` ``[L, H]``,
    ``random_s_best_iou`` ``[L]`` (same rule as ``s_best_iou``). meta: ``sources``, ``mass``,
    ``best_head``, ``num_images``, ``num_empty`` and the geometry.
    """

    description = ("Attention alignment with the ground-truth object masks: IoU between the smallest set of patches "
                   "holding 60% of a map's mass and the mask, per block (best head and per head).")
    summary = "IoU of attention maps with object masks"

    NEEDS = frozenset({"cls", "colsum"})
    required_targets = ("masks",)

    def __init__(self, mass: float = 0.6, best_head: str = "image", seed: int = 0, random_samples: int = 4,
                 random_kind: str = "uniform") -> None:
        if not 0.0 < float(mass) <= 1.0:
            raise VitscopeValueError(f"mass must be in (0, 1], got {mass}")
        if best_head not in BEST_HEAD_RULES:
            raise VitscopeValueError(f"best_head must be one of {BEST_HEAD_RULES}, got {best_head!r}")
        self._cfg_mass = float(mass)
        self._cfg_best_head = best_head
        super().__init__(seed=seed, random_samples=random_samples, random_kind=random_kind)

    def _declare_sums(self) -> None:
        self.add_state("num_empty", 0, reduce="sum")
        self.add_state("sums", {}, reduce="sum")  # source -> quantity -> tensor

    @staticmethod
    def _sources(geometry: AttentionGeometry) -> tuple[str, ...]:
        return ("cls", "spatial") if geometry.has_cls else ("spatial",)

    @staticmethod
    def _map(stats: BlockStats, source: str) -> torch.Tensor:
        return stats.cls if source == "cls" else stats.colsum

    def _masks(self, maps: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """``[..., K]`` maps -> ``[..., K]`` bool mass masks (:func:`~vitscope.functional.mass_mask`)."""
        return mass_mask(maps.reshape(*maps.shape[:-1], *grid), self._cfg_mass).reshape(maps.shape)

    def target_transforms(self, spec: ModelSpec) -> dict[str, tuple[str, Any]]:
        """The masks on the token grid, made in the engine's loading thread (PIL resizes, off the model's way)."""
        grid = spec.grid_for(*spec.image_size)
        return {MASK_GRID: ("masks", functools.partial(_grid_of_masks, spec=spec, grid=grid))}

    def _ground_truth(self, batch: Batch) -> np.ndarray:
        """``[B, K]`` bool: every image's union mask on the token grid (host data: the loader's, or made here)."""
        ready = batch.targets.get(MASK_GRID) if batch.targets else None
        if ready is not None and len(ready) == batch.size and all(
                r is not None and r[0] == tuple(batch.grid) for r in ready):
            return np.stack([r[1] for r in ready]).reshape(batch.size, -1)
        masks = batch.targets.get("masks") if batch.targets else None
        if masks is None:
            raise VitscopeValueError(
                f"{self.name} needs ground-truth instance masks, but this batch has none (targets: "
                f"{sorted(batch.targets or {}) or 'none'}); use a dataset with masks, e.g. --data ROOT::coco, or "
                "leave saliency_iou out"
            )
        if len(masks) != batch.size:
            raise VitscopeValueError(f"{self.name}: {len(masks)} mask sets for {batch.size} images; every image needs "
                                     "one")
        return np.stack([mask_to_grid(m, batch.spec, batch.grid, batch.frame) for m in masks]).reshape(batch.size,
                                                                                                     -1)

    @staticmethod
    def _iou(pred: torch.Tensor, gt: torch.Tensor) -> torch.Tensor:
        """IoU of bool ``pred [..., B, K]`` with ``gt [B, K]`` (gt non-empty, so the union is > 0)."""
        inter = (pred & gt).sum(dim=-1, dtype=torch.float64)
        union = (pred | gt).sum(dim=-1, dtype=torch.float64)
        return inter / union

    def _random_masks(self, device: torch.device, grid: tuple[int, int]) -> dict[str, torch.Tensor]:
        """``source -> [L, S, H, K]`` bool mass masks of the random baseline's maps at ``grid`` (computed once per
        grid, on ``device``)."""
        cache = getattr(self, "_cfg_random_masks", None)
        key = (self.geometry, self._cfg_seed, self._cfg_random_kind, self._cfg_random_samples, self._cfg_mass,
               str(device))
        if cache is None or cache[0] != key:
            self._cfg_random_masks = cache = (key, {})
        if grid not in cache[1]:
            stats = self._random(grid)
            cache[1][grid] = {s: self._masks(torch.stack([self._map(b, s) for b in stats]), grid).to(device)
                              for s in self._sources(self.geometry)}
        return cache[1][grid]

    def _update_blocks(self, geometry: AttentionGeometry, stats: list[BlockStats], batch: Batch) -> None:
        gt = self._ground_truth(batch)  # [B, K] bool, host data made by the loader: read with numpy
        rows = np.flatnonzero(gt.any(axis=-1))  # images with an object on the grid
        n = len(rows)
        self.num_empty += batch.size - n
        if n == 0:
            return
        device = self._map(stats[0], self._sources(geometry)[0]).device
        gt = torch.from_numpy(np.ascontiguousarray(gt[rows])).to(device, non_blocking=True)
        rows = torch.from_numpy(rows).to(device, non_blocking=True)
        heads = geometry.num_heads
        grid = (int(batch.grid[0]), int(batch.grid[1]))
        random = self._random_masks(device, grid)
        for source in self._sources(geometry):
            maps = torch.stack([self._map(s, source) for s in stats], dim=1).index_select(0, rows)  # [n, L, H, K]
            iou = self._iou(self._masks(maps, grid).permute(1, 2, 0, 3), gt)  # [L, H, n]
            best = iou.argmax(dim=1)  # [L, n], ties -> the lowest head
            rand = self._iou(random[source].unsqueeze(-2), gt)  # [L, S, H, n]
            add = {"iou_sum": iou.sum(dim=-1), "best_sum": iou.amax(dim=1).sum(dim=-1),
                   "best_count": torch.nn.functional.one_hot(best, heads).sum(dim=1).to(torch.float64),
                   "random_iou_sum": rand.mean(dim=1).sum(dim=-1),
                   "random_best_sum": rand.amax(dim=2).mean(dim=1).sum(dim=-1)}
            self._add(source, add)
        self.num_images += n

    def _add(self, source: str, add: dict[str, torch.Tensor]) -> None:
        mine = self.sums.setdefault(source, {})
        for k, v in add.items():
            mine[k] = added(mine.get(k), v)

    def compute(self) -> SaliencyIoUResult:
        meta = {**self._base_meta(), "mass": self._cfg_mass, "best_head": self._cfg_best_head,
                "num_empty": self.num_empty, "sources": list(self.sums)}
        if self.num_images == 0:
            return SaliencyIoUResult(name=self.name, tensors={}, meta=meta)
        n = self.num_images
        tensors: dict[str, torch.Tensor] = {}
        for s, sums in self.sums.items():
            iou = sums["iou_sum"] / n
            best_value, best_head = iou.amax(dim=-1), iou.argmax(dim=-1)  # ties -> the lowest head
            random_iou = sums["random_iou_sum"] / n
            by_image, random_by_image = sums["best_sum"] / n, sums["random_best_sum"] / n
            dataset_rule = self._cfg_best_head == "dataset"
            tensors.update({
                f"{s}_iou": iou,
                f"{s}_best_iou": best_value if dataset_rule else by_image,
                f"{s}_best_iou_image": by_image,
                f"{s}_best_iou_dataset": best_value,
                f"{s}_best_head_dataset": best_head,
                f"{s}_best_head_count": sums["best_count"].clone(),
                f"{s}_most_often_best": sums["best_count"].argmax(dim=-1),
                f"random_{s}_iou": random_iou,
                f"random_{s}_best_iou": random_iou.amax(dim=-1) if dataset_rule else random_by_image,
            })
        return SaliencyIoUResult(name=self.name, tensors=tensors, meta=meta)
