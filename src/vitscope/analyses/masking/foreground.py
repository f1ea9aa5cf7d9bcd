"""Foreground and background reliance (paper 001 section 5, tables 2 and 3).

Each image is classified three times: as it is, with only its foreground visible (the background
masked out) and with only its background visible (the foreground masked out); the foreground is the
union of the objects' boxes (``region="box"``, as paper 001 with ImageNet boxes) or of their segmentation
masks (``region="mask"``). Accuracies are normalised by the full-image accuracy, as the paper's tables.
Images without any object are left out (they have no foreground to show or hide).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitscope.analyses.base import Batch, Figure, Result
from vitscope.analyses.data_checks import missing_targets
from vitscope.analyses.masking.base import ModelAccumulator, topk_correct
from vitscope.analyses.registry import register_analysis
from vitscope.errors import VitscopeValueError
from vitscope.functional.occlusion import FILLS
from vitscope.models.spec import ModelSpec
from vitscope.occlusion.forward import masked_logits
from vitscope.occlusion.regions import REGIONS, Frame, boxes_foreground, foreground_pixel_mask
from vitscope.strict_json import note_null

__all__ = ["CONDITIONS", "ForegroundMasking", "ForegroundMaskingResult"]

CONDITIONS: tuple[str, ...] = ("full", "foreground_only", "background_only")
#: the targets the loader adds: ``(region, [H, W] bool foreground at model resolution)`` per image, from the
#: masks, or from the boxes of a dataset that has boxes alone
FOREGROUND, FOREGROUND_OF_BOXES = "foreground_pixels", "foreground_pixels_of_boxes"


def _foreground(masks: Any, spec: ModelSpec, region: str, frame: Frame | None = None) -> tuple[str, np.ndarray]:
    """``(region, [H, W] bool)``: one image's foreground at model resolution (host work, made by the loader), or
    in a view's frame (``Batch.frame``)."""
    return region, foreground_pixel_mask(masks, spec, region, frame).numpy()


def _foreground_of_boxes(boxes: Any, spec: ModelSpec, frame: Frame | None = None) -> tuple[str, np.ndarray]:
    """``("box", [H, W] bool)`` from ``(boxes [n, 4], image (height, width))``: the source's ``boxes`` target."""
    return "box", boxes_foreground(boxes[0], boxes[1], spec, frame).numpy()


class ForegroundMaskingResult(Result):
    """Result of :class:`ForegroundMasking`: the normalised accuracies as bars."""

    DIMS = {"*": ("condition", "top_k")}

    def figures(self) -> list[Figure]:
        """``<name>``: foreground-only and background-only accuracy / full accuracy, as bars."""
        if "normalised_accuracy" not in self.tensors:
            return []

        from vitscope.viz.masking_charts import foreground_chart

        normalised = {self.meta.get("model") or "model": self.tensors["normalised_accuracy"]}

        def draw(path: Path) -> list[Path]:
            from vitscope.viz.masking_figures import foreground_bars_figure

            return foreground_bars_figure(normalised, self.meta["topk"], path)

        return [self.figure("", draw, "Foreground-only (filled) and background-only (hatched) accuracy, normalised "
                            "by the full-image accuracy (dashed at 1).", "paper 001, tables 2 and 3",
                            chart=foreground_chart(normalised, self.meta["topk"]))]


@register_analysis("foreground_masking", groups=("masking",), default=False, order=180)
class ForegroundMasking(ModelAccumulator):
    """Top-k accuracy on full, foreground-only and background-only images (any classifier, ViT or CNN).

    Args:
        region: ``"box"`` or ``"mask"`` (module docstring).
        fill, blur_sigma: how masked-out pixels are filled (default black, ``"zero"``).
        topk: the k of each reported top-k accuracy (capped at the number of classes).

    State: ``num_images`` (images seen), ``used`` (images with a foreground), ``correct`` ``[3, len(topk)]``
    float64 (full, foreground only, background only), ``foreground_fraction`` (sum of foreground areas).

    Result tensors: ``accuracy`` ``[3, k]``, ``normalised_accuracy`` ``[3, k]`` (row / full row; NaN when the
    full accuracy is 0).
    """

    description = ("Accuracy on the full image, the foreground only and the background only (ground-truth boxes or "
                   "masks), normalised by the full-image accuracy.")
    summary = "foreground-only / background-only accuracy"

    required_targets = ("label",)  # and masks, or (region "box") boxes: why_unsupported_data

    def __init__(self, region: str = "box", fill: str = "zero", blur_sigma: float = 4.0,
                 topk: Sequence[int] = (1, 5)) -> None:
        if region not in REGIONS:
            raise VitscopeValueError(f"region must be one of {', '.join(REGIONS)}, got {region!r}")
        if fill not in FILLS:
            raise VitscopeValueError(f"fill must be one of {', '.join(FILLS)}, got {fill!r}")
        if not topk or any(int(k) < 1 for k in topk):
            raise VitscopeValueError(f"topk must be positive integers, got {list(topk)}")
        self._cfg_region, self._cfg_fill, self._cfg_blur = region, fill, float(blur_sigma)
        self._cfg_topk = tuple(int(k) for k in topk)
        super().__init__()

    def required_hooks(self, spec) -> list[str]:
        return []

    def _declare_counts(self) -> None:
        self.add_state("used", 0, reduce="sum")
        self.add_state("correct", torch.zeros(len(CONDITIONS), len(self._cfg_topk), dtype=torch.float64))
        self.add_state("foreground_fraction", 0.0, reduce="sum")

    def why_unsupported_data(self, data: Any) -> str | None:
        """Labels, and the objects: masks, or for ``region="box"`` masks or boxes (ImageNet's)."""
        reason = super().why_unsupported_data(data)  # the labels, every image's
        if reason is None and "masks" not in data.targets and (self._cfg_region == "mask"
                                                               or "boxes" not in data.targets):
            reason = missing_targets(self.name, {"masks"} if self._cfg_region == "mask" else {"masks or boxes"})
        return reason

    def target_transforms(self, spec: ModelSpec) -> dict[str, tuple[str, Any]]:
        """The foreground at model resolution, made where images decode (the loader's workers)."""
        made = {FOREGROUND: ("masks", functools.partial(_foreground, spec=spec, region=self._cfg_region))}
        if self._cfg_region == "box":
            made[FOREGROUND_OF_BOXES] = ("boxes", functools.partial(_foreground_of_boxes, spec=spec))
        return made

    def _foregrounds(self, batch: Batch) -> np.ndarray:
        """``[B, H, W]`` bool foreground of every image (host data: the loader's, or made here in the geometry of
        the run's view, ``batch.frame``, when the loader did not make it)."""
        frame = tuple(batch.pixels.shape[-2:])
        for key in (FOREGROUND, FOREGROUND_OF_BOXES):
            ready = batch.targets.get(key)
            if ready is not None and len(ready) == batch.size and all(
                    r is not None and r[0] == self._cfg_region and r[1].shape == frame for r in ready):
                return np.stack([r[1] for r in ready])
        masks, boxes = batch.targets.get("masks"), batch.targets.get("boxes")
        if masks is not None:
            return np.stack([_foreground(m, batch.spec, self._cfg_region, batch.frame)[1] for m in masks])
        if boxes is not None and self._cfg_region == "box":
            return np.stack([_foreground_of_boxes(b, batch.spec, batch.frame)[1] for b in boxes])
        raise VitscopeValueError(f"analysis '{self.name}' needs object masks or boxes (batch.targets['masks'] or "
                                 "['boxes'])")

    def _update_counts(self, record: Mapping[str, torch.Tensor], batch: Batch, labels: torch.Tensor) -> None:
        foregrounds = self._foregrounds(batch)  # read with numpy: the decisions below wait for no device
        rows = np.flatnonzero(foregrounds.reshape(batch.size, -1).any(axis=1))
        if not len(rows):
            return
        device = batch.pixels.device
        picked = torch.from_numpy(rows)
        pixels = batch.pixels.index_select(0, picked.to(device, non_blocking=True))
        fg = torch.from_numpy(np.ascontiguousarray(foregrounds[rows])).to(device, non_blocking=True)
        labels = labels.index_select(0, picked)
        self.used += len(rows)
        self.foreground_fraction += float(foregrounds[rows].astype(np.float64).mean(axis=(1, 2)).sum())
        self.correct = self.correct.to(device)
        for i, condition in enumerate(CONDITIONS):
            if condition == "full":
                logits = self._full_logits(pixels, batch)
            else:
                hide = ~fg if condition == "foreground_only" else fg
                logits = self._run(lambda b, hide=hide: masked_logits(
                    b, pixels, mode="pixel", fill=self._cfg_fill, blur_sigma=self._cfg_blur, pixel_mask=hide), batch)
            for j, k in enumerate(self._cfg_topk):
                self.correct[i, j] += topk_correct(logits, labels, k).sum()

    def compute(self) -> ForegroundMaskingResult:
        meta = self._meta() | {"conditions": list(CONDITIONS), "topk": list(self._cfg_topk),
                               "region": self._cfg_region, "fill": self._cfg_fill, "images_used": self.used}
        if self.used == 0:
            meta["error"] = (f"no image has a foreground inside the model's input ({self._cfg_region} regions after "
                             "the resize and crop)")
            return ForegroundMaskingResult(name=self.name, tensors={}, meta=meta)
        acc = self.correct / self.used
        full = acc[0:1]
        norm = torch.where(full > 0, acc / full.clamp(min=1e-300), torch.full_like(acc, float("nan")))
        meta["mean_foreground_fraction"] = self.foreground_fraction / self.used
        if norm.isnan().any():
            note_null(meta, "normalised_accuracy", "the full-image accuracy is 0 at some top-k")
        return ForegroundMaskingResult(name=self.name, tensors={"accuracy": acc, "normalised_accuracy": norm},
                                       meta=meta)
