"""Foreground regions of dataset items in the model's geometry (paper 001 section 5: boxes)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image

from vitscope.errors import VitscopeValueError
from vitscope.functional.concept_tokens import token_coverage, token_region_labels
from vitscope.functional.occlusion import boxes_pixel_mask, masks_bounding_boxes
from vitscope.models.preprocess import frame_size, resize_crop
from vitscope.models.spec import ModelSpec

__all__ = ["REGIONS", "foreground_pixel_mask", "instance_masks_to_model", "token_regions"]

REGIONS: tuple[str, ...] = ("box", "mask")


def instance_masks_to_model(masks: np.ndarray | Sequence[np.ndarray], spec: ModelSpec) -> torch.Tensor:
    """Instance masks at the image's size -> ``[n, H, W]`` bool at model resolution.

    Each mask goes through the image's own resize and centre crop with nearest-neighbour sampling
    (docs/methods.md, Shared rules: masks follow the pixels' geometric transform).
    """
    out = []
    masks = np.asarray(masks)
    for m in masks:
        img = Image.fromarray(np.where(np.asarray(m) > 0, 255, 0).astype(np.uint8), mode="L")
        out.append(torch.from_numpy(np.asarray(resize_crop(img, spec, Image.Resampling.NEAREST)) > 127))
    h, w = frame_size(masks.shape[-2:], spec) if masks.ndim == 3 else spec.image_size  # no mask: its frame still
    return torch.stack(out) if out else torch.zeros(0, h, w, dtype=torch.bool)


def foreground_pixel_mask(masks: np.ndarray | Sequence[np.ndarray], spec: ModelSpec,
                          region: str = "box") -> torch.Tensor:
    """Foreground of one image at model resolution: ``[H, W]`` bool.

    Args:
        masks: ``[n, H0, W0]`` instance masks at the image's size (``n`` may be 0: no foreground).
        spec: the model's ModelSpec (its resize and crop).
        region: ``"box"`` (union of the instances' bounding boxes, as paper 001 with ImageNet boxes) or
            ``"mask"`` (union of the segmentation masks).
    """
    if region not in REGIONS:
        raise VitscopeValueError(f"region must be one of {REGIONS}, got {region!r}")
    model_masks = instance_masks_to_model(masks, spec)
    frame = tuple(model_masks.shape[-2:])
    if region == "mask":
        return model_masks.any(dim=0) if len(model_masks) else torch.zeros(frame, dtype=torch.bool)
    return boxes_pixel_mask(masks_bounding_boxes(model_masks), frame)


def token_regions(masks: np.ndarray | Sequence[np.ndarray], labels: Sequence[int], spec: ModelSpec,
                  grid: Sequence[int] | None = None) -> tuple[tuple[int, int], np.ndarray]:
    """The region label of every token of one image: the label whose masks (their union: instances of one label
    count together) cover more than half of the token's pixels at model resolution, else -1 (background).

    Args:
        masks: ``[n, H0, W0]`` instance masks at the image's size; labels: ``[n]`` their labels (a COCO category, a
            PartImageNet part...).
        spec: the model's ModelSpec (its resize and crop); grid: ``(h, w)`` token grid (None: the grid of the
            image's own frame at model resolution, as a run that keeps aspect ratios makes it).

    Returns:
        ``((h, w), [h * w] int64)``, tokens row-major.
    """
    model_masks = instance_masks_to_model(masks, spec)
    if len(labels) != len(model_masks):
        raise VitscopeValueError(f"{len(model_masks)} masks but {len(labels)} labels")
    h, w = (int(v) for v in (grid if grid is not None else spec.grid_for(*model_masks.shape[-2:])))
    given = torch.as_tensor([int(v) for v in labels], dtype=torch.int64)
    names = torch.unique(given)
    union = torch.stack([model_masks[given == v].any(dim=0) for v in names]) if len(names) else model_masks[:0]
    return (h, w), token_region_labels(token_coverage(union, (h, w)), names).numpy()
