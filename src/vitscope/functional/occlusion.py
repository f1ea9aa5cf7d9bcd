"""Patch and pixel masks, and filling masked pixels (the pure half of :mod:`vitscope.occlusion`).

Conventions: a mask is True where the image is HIDDEN. Patch masks are ``[B, h, w]`` bool on the token
grid (row-major like the tokens); pixel masks ``[B, H, W]`` bool. Pixels are the model's normalised
input ``[B, 3, H, W]``; ``mean`` / ``std`` are the model's (``spec.mean``, ``spec.std``). Boxes are
``[x1, y1, x2, y2]`` float pixels, 0-based, x2/y2 exclusive (docs/methods.md, Shared rules); a pixel belongs to a
box when its centre does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from vitscope.errors import VitscopeValueError

__all__ = [
    "FILLS",
    "boxes_pixel_mask",
    "fill_pixels",
    "gaussian_blur",
    "masked_count",
    "masks_bounding_boxes",
    "patch_to_pixel_mask",
    "pixel_to_patch_mask",
    "random_patch_mask",
    "round_half_up",
    "score_patch_mask",
]

FILLS: tuple[str, ...] = ("zero", "mean", "blur")
ORDERS: tuple[str, ...] = ("top", "bottom")


def round_half_up(x: float) -> int:
    """``floor(x + 0.5)`` of a product such as ``ratio * K`` (x >= 0), taking ``x`` to 9 decimals first: the float
    product of 0.7 and 165 is 115.49999999999999, whose exact value 115.5 rounds up (Python's ``round`` would
    round half to even)."""
    return math.floor(round(x, 9) + 0.5)


def masked_count(ratio: float, k: int) -> int:
    """How many of ``k`` patches a mask ratio hides: ``floor(ratio * k + 0.5)``."""
    if not 0.0 <= ratio <= 1.0:
        raise VitscopeValueError(f"mask ratio must be in [0, 1], got {ratio}")
    return round_half_up(ratio * k)  # as docs/methods.md, SIFT patch interrelation


def score_patch_mask(scores: torch.Tensor, ratio: float, order: str = "top") -> torch.Tensor:
    """Mask the ``floor(ratio * K + 0.5)`` patches with the highest (``"top"``) or lowest (``"bottom"``) scores.

    Ties go to the lower row-major index (stable sort), so the mask is deterministic.

    Args:
        scores: ``[B, h, w]`` per-patch scores (e.g. :func:`~vitscope.functional.interrelation_patch_scores`).
        ratio: fraction of patches to mask.
        order: ``"top"`` or ``"bottom"``.

    Returns:
        ``[B, h, w]`` bool, True = masked.
    """
    if order not in ORDERS:
        raise VitscopeValueError(f"order must be one of {ORDERS}, got {order!r}")
    if scores.dim() != 3:
        raise VitscopeValueError(f"scores must be [B, h, w], got {tuple(scores.shape)}")
    b, h, w = scores.shape
    m = masked_count(ratio, h * w)
    ranked = torch.sort(scores.reshape(b, -1), dim=-1, descending=order == "top", stable=True).indices
    mask = torch.zeros(b, h * w, dtype=torch.bool, device=scores.device)
    mask.scatter_(1, ranked[:, :m], True)
    return mask.reshape(b, h, w)


def random_patch_mask(batch: int, grid: Sequence[int], ratio: float, generator: torch.Generator) -> torch.Tensor:
    """``[batch, h, w]`` bool masks of ``floor(ratio * K + 0.5)`` uniformly random patches per image."""
    h, w = (int(v) for v in grid)
    m = masked_count(ratio, h * w)
    ranked = torch.rand(batch, h * w, generator=generator).argsort(dim=-1)
    mask = torch.zeros(batch, h * w, dtype=torch.bool)
    mask.scatter_(1, ranked[:, :m], True)
    return mask.reshape(batch, h, w)


def patch_to_pixel_mask(mask: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """Patch mask ``[B, h, w]`` -> pixel mask ``[B, H, W]`` (each patch covers its block of pixels, nearest)."""
    if mask.dim() != 3:
        raise VitscopeValueError(f"mask must be [B, h, w], got {tuple(mask.shape)}")
    out = F.interpolate(mask[:, None].float(), size=tuple(int(s) for s in size), mode="nearest")
    return out[:, 0] > 0.5


def pixel_to_patch_mask(mask: torch.Tensor, grid: Sequence[int], threshold: float = 0.5) -> torch.Tensor:
    """Pixel mask ``[B, H, W]`` -> patch mask ``[B, h, w]``: a patch is masked when at least ``threshold`` of
    its pixels are (patches are the ``H/h x W/w`` blocks; H and W must be multiples of h and w)."""
    h, w = (int(v) for v in grid)
    if mask.dim() != 3 or mask.shape[1] % h or mask.shape[2] % w:
        raise VitscopeValueError(f"mask must be [B, H, W] with H, W multiples of the grid {h}x{w}, got "
                                 f"{tuple(mask.shape)}")
    frac = F.adaptive_avg_pool2d(mask[:, None].float(), (h, w))[:, 0]
    return frac >= threshold - 1e-9


def boxes_pixel_mask(boxes: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """Union of boxes as a pixel mask: ``[n, 4]`` -> ``[H, W]`` bool (pixel centres inside a box)."""
    height, width = (int(v) for v in size)
    boxes = torch.as_tensor(boxes, dtype=torch.float64).reshape(-1, 4)
    ys = torch.arange(height, dtype=torch.float64, device=boxes.device) + 0.5
    xs = torch.arange(width, dtype=torch.float64, device=boxes.device) + 0.5
    rows = (ys >= boxes[:, 1:2]) & (ys < boxes[:, 3:4])  # [n, H]
    cols = (xs >= boxes[:, 0:1]) & (xs < boxes[:, 2:3])  # [n, W]
    return (rows[:, :, None] & cols[:, None, :]).any(dim=0)  # one pass, no value read on the host


def masks_bounding_boxes(masks: torch.Tensor) -> torch.Tensor:
    """Tight boxes of instance masks: ``[n, H, W]`` bool -> ``[m, 4]`` float (empty masks are dropped)."""
    boxes = []
    for m in torch.as_tensor(masks).bool():
        rows, cols = m.any(dim=1).nonzero().flatten(), m.any(dim=0).nonzero().flatten()
        if len(rows):
            boxes.append([float(cols[0]), float(rows[0]), float(cols[-1] + 1), float(rows[-1] + 1)])
    return torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4)


def gaussian_blur(pixels: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur of ``[B, C, H, W]`` (kernel radius ``ceil(3 sigma)``, reflect padding)."""
    if sigma <= 0:
        return pixels.clone()
    radius = max(1, math.ceil(3 * sigma))
    x = torch.arange(-radius, radius + 1, dtype=pixels.dtype, device=pixels.device)
    kernel = torch.exp(-(x**2) / (2 * sigma**2))
    kernel = kernel / kernel.sum()
    c = pixels.shape[1]
    pad_mode = "reflect" if min(pixels.shape[-2:]) > radius else "replicate"
    out = F.pad(pixels, (radius, radius, 0, 0), mode=pad_mode)
    out = F.conv2d(out, kernel.view(1, 1, 1, -1).expand(c, 1, 1, -1), groups=c)
    out = F.pad(out, (0, 0, radius, radius), mode=pad_mode)
    return F.conv2d(out, kernel.view(1, 1, -1, 1).expand(c, 1, -1, 1), groups=c)


def fill_pixels(
    pixels: torch.Tensor, mask: torch.Tensor, fill: str = "mean", mean: Sequence[float] = (0.0, 0.0, 0.0),
    std: Sequence[float] = (1.0, 1.0, 1.0), blur_sigma: float = 4.0,
) -> torch.Tensor:
    """Replace the masked pixels of a normalised batch.

    Args:
        pixels: ``[B, 3, H, W]`` normalised input.
        mask: ``[B, H, W]`` bool, True = replace.
        fill: ``"zero"`` (black pixels, i.e. ``-mean / std`` after normalisation), ``"mean"`` (the dataset
            mean colour, i.e. 0 after normalisation) or ``"blur"`` (a Gaussian-blurred copy of the image).
        mean, std: the model's normalisation.
        blur_sigma: Gaussian sigma in pixels for ``"blur"``.

    Returns:
        A new ``[B, 3, H, W]`` tensor; with an all-False mask it equals ``pixels`` exactly.
    """
    if fill not in FILLS:
        raise VitscopeValueError(f"fill must be one of {FILLS}, got {fill!r}")
    if mask.shape != (pixels.shape[0], *pixels.shape[-2:]):
        raise VitscopeValueError(f"mask must be [B, H, W] = {[pixels.shape[0], *pixels.shape[-2:]]}, got "
                                 f"{list(mask.shape)}")
    if fill == "zero":
        m = torch.tensor(mean, dtype=pixels.dtype, device=pixels.device).view(1, -1, 1, 1)
        s = torch.tensor(std, dtype=pixels.dtype, device=pixels.device).view(1, -1, 1, 1)
        value = (-m / s).expand_as(pixels)
    elif fill == "mean":
        value = torch.zeros_like(pixels)
    else:
        value = gaussian_blur(pixels, blur_sigma)
    return torch.where(mask[:, None].to(pixels.device), value, pixels)
