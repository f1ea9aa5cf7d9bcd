"""Model preprocessing without torchvision: resize the short side, centre crop, normalise."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image

from vitscope.errors import VitscopeTypeError, VitscopeValueError
from vitscope.models.spec import ModelSpec

_RESAMPLE = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
}


def resample_filter(name: str) -> Image.Resampling:
    try:
        return _RESAMPLE[name]
    except KeyError:
        raise VitscopeValueError(f"unknown interpolation '{name}'; use one of {', '.join(_RESAMPLE)}") from None


def resize_crop_geometry(image_hw: tuple[int, int], spec: ModelSpec) -> tuple[tuple[int, int], int, int]:
    """Where :func:`resize_crop` puts an ``image_hw`` image: ``((new_h, new_w), left, top)``.

    The image is resized to ``(new_h, new_w)`` and the crop starts at column ``left``, row ``top``.
    """
    out_h, out_w = spec.image_size
    short = spec.resize_size or max(out_h, out_w)
    h, w = image_hw
    scale = short / min(w, h)
    new_w, new_h = max(out_w, round(w * scale)), max(out_h, round(h * scale))
    return (new_h, new_w), (new_w - out_w) // 2, (new_h - out_h) // 2


def resize_crop(image: Image.Image, spec: ModelSpec, resample: Image.Resampling | None = None) -> Image.Image:
    """Resize so the short side is ``spec.resize_size`` (default: the crop's long side), then centre crop.

    The same function is used for masks (pass ``resample=NEAREST``) so geometry always agrees.
    """
    out_h, out_w = spec.image_size
    (new_h, new_w), left, top = resize_crop_geometry((image.height, image.width), spec)
    image = image.resize((new_w, new_h), resample if resample is not None else resample_filter(spec.interpolation))
    return image.crop((left, top, left + out_w, top + out_h))


def to_pil(image: Any) -> Image.Image:
    """PIL image or ``[H, W, 3]`` / ``[H, W]`` uint8 array -> RGB PIL image."""
    if isinstance(image, Image.Image):
        return image if image.mode == "RGB" else image.convert("RGB")
    arr = np.asarray(image)
    if arr.dtype != np.uint8:
        raise VitscopeTypeError(f"arrays must be uint8 HxWx3, got {arr.dtype} {arr.shape}")
    return Image.fromarray(arr).convert("RGB")


def preprocess_images(images: Sequence[Any], spec: ModelSpec) -> torch.Tensor:
    """Images -> ``[B, 3, H, W]`` float32, normalised with ``spec.mean`` / ``spec.std``."""
    return normalise_pixels(resized_pixels(images, spec), spec)


def resized_pixels(images: Sequence[Any], spec: ModelSpec) -> torch.Tensor:
    """Images -> ``[B, 3, H, W]`` uint8 after the model's resize and centre crop: the first half of
    :func:`preprocess_images`, a quarter of its bytes to send between processes or to a GPU."""
    if isinstance(images, (Image.Image, np.ndarray)):
        images = [images]
    if len(images) == 0:
        raise VitscopeValueError("preprocess got no images")
    arrays = [np.asarray(resize_crop(to_pil(im), spec), dtype=np.uint8) for im in images]
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()


def normalise_pixels(pixels: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    """``[B, 3, H, W]`` uint8 -> float32 ``(x / 255 - mean) / std`` on the pixels' device: the second half of
    :func:`preprocess_images` (float32 operations, correctly rounded on CPU and GPU alike: the same bits)."""
    mean = torch.tensor(spec.mean, dtype=torch.float32, device=pixels.device).view(1, 3, 1, 1)
    std = torch.tensor(spec.std, dtype=torch.float32, device=pixels.device).view(1, 3, 1, 1)
    # a tensor divisor, not the number 255: CUDA divides by a number as a product with its reciprocal,
    # which rounds differently from the CPU's division
    scale = torch.tensor(255.0, dtype=torch.float32, device=pixels.device)
    return (pixels.float() / scale - mean) / std
