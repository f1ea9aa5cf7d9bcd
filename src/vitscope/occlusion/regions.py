"""Foreground regions of dataset items in the model's geometry (paper 001 section 5: boxes)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from PIL import Image

from vitscope.errors import VitscopeValueError
from vitscope.functional.concept_tokens import token_coverage, token_region_labels
from vitscope.functional.occlusion import boxes_pixel_mask, masks_bounding_boxes
from vitscope.models.preprocess import frame_size, resize_crop, resize_crop_geometry
from vitscope.models.spec import ModelSpec

__all__ = ["REGIONS", "boxes_foreground", "boxes_to_model", "foreground_pixel_mask", "instance_masks_to_model",
           "token_regions"]

REGIONS: tuple[str, ...] = ("box", "mask")


#: a view's geometry from an original image (or a mask as a mode ``"L"`` image) to the model's frame:
#: ``frame(image, resample) -> image`` (``Batch.frame``)
Frame = Callable[[Image.Image, Image.Resampling | None], Image.Image]


def _to_frame(mask: np.ndarray, spec: ModelSpec, frame: Frame | None) -> torch.Tensor:
    """One ``[H0, W0]`` mask -> ``[H, W]`` bool in the model's frame, sampled nearest-neighbour."""
    img = Image.fromarray(np.where(np.asarray(mask) > 0, 255, 0).astype(np.uint8), mode="L")
    moved = resize_crop(img, spec, Image.Resampling.NEAREST) if frame is None else frame(img, Image.Resampling.NEAREST)
    return torch.from_numpy(np.asarray(moved) > 127)


def instance_masks_to_model(masks: np.ndarray | Sequence[np.ndarray], spec: ModelSpec,
                            frame: Frame | None = None) -> torch.Tensor:
    """Instance masks at the image's size -> ``[n, H, W]`` bool at model resolution.

    Each mask goes through the image's own resize and centre crop, or a view's geometry (``frame``), with
    nearest-neighbour sampling (docs/methods.md, Shared rules: masks follow the pixels' geometric transform).

    Args:
        masks: ``[n, H0, W0]`` instance masks at the image's size.
        spec: the model's ModelSpec (its resize and crop).
        frame: the run's view's geometry (``Batch.frame``); None: the model's own resize and crop.
    """
    masks = np.asarray(masks)
    out = [_to_frame(m, spec, frame) for m in masks]
    if out:
        return torch.stack(out)
    if masks.ndim == 3 and frame is not None:  # no mask: its frame still, the one the view makes of the image
        h, w = _to_frame(np.zeros(masks.shape[-2:], dtype=bool), spec, frame).shape
    else:
        h, w = frame_size(masks.shape[-2:], spec) if masks.ndim == 3 else spec.image_size
    return torch.zeros(0, h, w, dtype=torch.bool)


def foreground_pixel_mask(masks: np.ndarray | Sequence[np.ndarray], spec: ModelSpec,
                          region: str = "box", frame: Frame | None = None) -> torch.Tensor:
    """Foreground of one image at model resolution: ``[H, W]`` bool.

    Args:
        masks: ``[n, H0, W0]`` instance masks at the image's size (``n`` may be 0: no foreground).
        spec: the model's ModelSpec (its resize and crop).
        region: ``"box"`` (union of the instances' bounding boxes, as paper 001 with ImageNet boxes) or
            ``"mask"`` (union of the segmentation masks).
        frame: the run's view's geometry (``Batch.frame``); None: the model's own resize and crop.
    """
    if region not in REGIONS:
        raise VitscopeValueError(f"region must be one of {REGIONS}, got {region!r}")
    if region == "mask":
        model_masks = instance_masks_to_model(masks, spec, frame)
        return model_masks.any(dim=0) if len(model_masks) else torch.zeros(model_masks.shape[-2:], dtype=torch.bool)
    masks = np.asarray(masks)
    image_hw = tuple(masks.shape[-2:]) if masks.ndim == 3 else tuple(spec.image_size)
    # the objects' boxes at the image's own size, taken through its resize and crop: a box the crop cuts keeps
    # its part in the frame (the box of the cropped mask would shrink to the mask's surviving pixels)
    boxes = masks_bounding_boxes(torch.from_numpy(masks)) if masks.ndim == 3 else torch.zeros(0, 4)
    return boxes_foreground(boxes, image_hw, spec, frame)


def boxes_foreground(boxes: np.ndarray | torch.Tensor, image_hw: Sequence[int], spec: ModelSpec,
                     frame: Frame | None = None) -> torch.Tensor:
    """The union of ``[n, 4]`` boxes of an ``image_hw`` image at model resolution: ``[H, W]`` bool (a dataset of
    boxes without masks, as ImageNet's).

    Under a view (``frame``, ``Batch.frame``) the boxes are drawn at the image's size and that drawing goes
    through the view's geometry, as the pixels do: a box the frame cuts keeps its part inside it.
    """
    hw = tuple(int(v) for v in image_hw)
    if frame is not None:
        return _to_frame(boxes_pixel_mask(torch.as_tensor(boxes, dtype=torch.float64).reshape(-1, 4), hw), spec,
                         frame)
    return boxes_pixel_mask(boxes_to_model(torch.as_tensor(boxes), hw, spec), frame_size(hw, spec))


def boxes_to_model(boxes: torch.Tensor, image_hw: Sequence[int], spec: ModelSpec) -> torch.Tensor:
    """``[n, 4]`` boxes ``(x1, y1, x2, y2)`` in pixels of an ``image_hw`` image -> the same boxes in the model's
    frame (the image's resize and crop, :func:`~vitscope.models.preprocess.resize_crop_geometry`), clipped to it."""
    (new_h, new_w), left, top = resize_crop_geometry(tuple(int(v) for v in image_hw), spec)
    out_h, out_w = frame_size(tuple(int(v) for v in image_hw), spec)
    scale = torch.tensor([new_w / image_hw[1], new_h / image_hw[0]] * 2, dtype=torch.float64)
    shift = torch.tensor([left, top] * 2, dtype=torch.float64)
    moved = torch.as_tensor(boxes, dtype=torch.float64).reshape(-1, 4) * scale - shift
    limit = torch.tensor([out_w, out_h] * 2, dtype=torch.float64)
    return torch.minimum(moved.clamp(min=0.0), limit)


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
