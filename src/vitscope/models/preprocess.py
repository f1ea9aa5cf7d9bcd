"""Model preprocessing without torchvision: resize the short side (or the whole image to a fixed size), centre
crop, normalise; or, under a token budget, keep each image's aspect ratio (SigLIP 2 NaFlex, ``--keep-aspect``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image

from vitscope.data.images import as_rgb8, full_size
from vitscope.errors import VitscopeTypeError, VitscopeValueError
from vitscope.models.spec import INTERPOLATIONS, ModelSpec

#: a resized image above this many pixels (192 MiB in RGB) is cropped before it is resized (:func:`resize_crop`)
CROP_FIRST_PIXELS = 1 << 26
_RESAMPLE = {name: Image.Resampling[name.upper()] for name in INTERPOLATIONS}


def resample_filter(name: str) -> Image.Resampling:
    try:
        return _RESAMPLE[name]
    except KeyError:
        raise VitscopeValueError(f"unknown interpolation '{name}'; use one of {', '.join(_RESAMPLE)}") from None


def aspect_size(image_hw: tuple[int, int], patch: int, max_tokens: int, eps: float = 1e-5) -> tuple[int, int]:
    """``(height, width)`` an ``image_hw`` image is resized to when it keeps its aspect ratio under a token budget:
    SigLIP 2 NaFlex's rule. Each side is ``ceil(side * s / patch) * patch`` (at least one patch) for the largest
    scale ``s`` whose grid has at most ``max_tokens`` patches, found by bisection to ``eps`` as the published
    processor finds it (so both give the same size, ties at a step of the grid included).

    Args:
        image_hw: the image's ``(height, width)`` in pixels.
        patch: the model's patch size.
        max_tokens: the most patches an image may have.
    """
    if max_tokens < 1 or patch < 1:
        raise VitscopeValueError(f"the token budget and the patch size must be at least 1, got {max_tokens}, {patch}")

    def side(n: int, scale: float) -> int:
        return max(patch, math.ceil(n * scale / patch) * patch)

    def fits(scale: float) -> bool:
        return side(image_hw[0], scale) * side(image_hw[1], scale) <= max_tokens * patch * patch

    low, high = eps / 10, 100.0  # the bisection keeps: low fits (or is the smallest scale tried), high does not
    while high - low >= eps:
        middle = (low + high) / 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return side(image_hw[0], low), side(image_hw[1], low)


def resize_crop_geometry(image_hw: tuple[int, int], spec: ModelSpec) -> tuple[tuple[int, int], int, int]:
    """Where :func:`resize_crop` puts an ``image_hw`` image: ``((new_h, new_w), left, top)``.

    The image is resized to ``(new_h, new_w)`` and the crop starts at column ``left``, row ``top``. With a token
    budget (``spec.max_tokens``) the whole image is resized to :func:`aspect_size` and nothing is cropped; with a
    ``(h, w)`` ``spec.resize_size`` the whole image is resized to it, whatever its aspect ratio. Sizes and offsets
    round as the model's library does (``spec.resize_rule``).
    """
    if spec.max_tokens:
        return aspect_size(image_hw, spec.patch_size, spec.max_tokens), 0, 0
    out_h, out_w = spec.image_size
    if isinstance(spec.resize_size, (tuple, list)):
        new_h, new_w = (int(v) for v in spec.resize_size)
    else:
        short = spec.resize_size or max(out_h, out_w)
        h, w = image_hw
        if spec.resize_rule == "vitscope":
            scale = short / min(w, h)
            new_w, new_h = round(w * scale), round(h * scale)
        elif w <= h:  # transformers and torchvision: the short side exactly, the long one truncated
            new_w, new_h = short, int(short * h / w)
        else:
            new_w, new_h = int(short * w / h), short
        new_w, new_h = max(out_w, new_w), max(out_h, new_h)
    if spec.resize_rule == "torchvision":
        return (new_h, new_w), int(round((new_w - out_w) / 2.0)), int(round((new_h - out_h) / 2.0))
    return (new_h, new_w), (new_w - out_w) // 2, (new_h - out_h) // 2


def frame_size(image_hw: tuple[int, int], spec: ModelSpec) -> tuple[int, int]:
    """``(H, W)`` of the model input an ``image_hw`` image becomes: ``spec.image_size``, or under a token budget
    the image's own :func:`aspect_size`."""
    return resize_crop_geometry(image_hw, spec)[0] if spec.max_tokens else tuple(spec.image_size)


def resize_crop(image: Image.Image, spec: ModelSpec, resample: Image.Resampling | None = None) -> Image.Image:
    """Resize so the short side is ``spec.resize_size`` (default: the crop's long side; a ``(h, w)`` size: the whole
    image to it), then centre crop.

    The same function is used for masks (pass ``resample=NEAREST``) so geometry always agrees. A drafted JPEG
    follows the geometry of its full decode (:func:`~vitscope.data.images.full_size`).
    """
    (new_h, new_w), left, top = resize_crop_geometry(full_size(image), spec)
    out_h, out_w = (new_h, new_w) if spec.max_tokens else spec.image_size
    resample = resample if resample is not None else resample_filter(spec.interpolation)
    if new_h * new_w > CROP_FIRST_PIXELS:
        # a strip (a 60000 x 1 PNG of 260 bytes) would be resized to gigabytes before its crop; Pillow's crop box
        # gives the same geometry from a few pixels, rounding some by a level or more, so only such images take it
        sx, sy = image.width / new_w, image.height / new_h
        box = (left * sx, top * sy, (left + out_w) * sx, (top + out_h) * sy)
        return image.resize((out_w, out_h), resample, box=box)
    image = image.resize((new_w, new_h), resample)
    return image.crop((left, top, left + out_w, top + out_h))


def to_pil(image: Any) -> Image.Image:
    """PIL image or uint8 array ``[H, W, 3]`` (``[H, W]`` grey, ``[H, W, 4]`` with alpha) -> RGB PIL image,
    converted as a file of it would be (:func:`~vitscope.data.images.as_rgb8`).

    Raises:
        VitscopeTypeError: an array of another dtype or shape (channels first, a batch...).
    """
    if isinstance(image, Image.Image):
        return as_rgb8(image)
    arr = np.asarray(image)
    if arr.dtype != np.uint8 or not (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[-1] in (3, 4))):
        raise VitscopeTypeError(f"images must be PIL images or uint8 arrays [H, W, 3] (or [H, W], [H, W, 4]; a "
                                f"batch: [B, H, W, 3]), got a {arr.dtype} array of shape {list(arr.shape)}")
    return as_rgb8(Image.fromarray(arr))


def preprocess_images(images: Sequence[Any], spec: ModelSpec) -> torch.Tensor:
    """Images -> ``[B, 3, H, W]`` float32, normalised with ``spec.mean`` / ``spec.std``.

    ``images``: a sequence of PIL images or uint8 ``[H, W, 3]`` arrays (:func:`to_pil`), one of them alone, or a
    ``[B, H, W, 3]`` uint8 array or tensor (a batch of ``B`` images).

    Raises:
        VitscopeTypeError: an array that is not such an image (:func:`to_pil`).
        VitscopeValueError: with a token budget (``spec.max_tokens``), images whose grids differ (they cannot be
            one tensor: :func:`pixel_groups` groups them, as ``vitscope.run`` does).
    """
    return normalise_pixels(resized_pixels(images, spec), spec)


def _frames(images: Sequence[Any], spec: ModelSpec) -> list[np.ndarray]:
    if isinstance(images, torch.Tensor):  # as the array it holds: iterating one image would give its rows
        images = images.detach().cpu().numpy()
    if isinstance(images, np.ndarray):
        images = list(images) if images.ndim == 4 else [images]  # [B, H, W, 3]: a batch; else one image
    elif isinstance(images, Image.Image):
        images = [images]
    if len(images) == 0:
        raise VitscopeValueError("preprocess got no images")
    return [np.asarray(resize_crop(to_pil(im), spec), dtype=np.uint8) for im in images]


def _stacked(arrays: Sequence[np.ndarray]) -> torch.Tensor:
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()


def resized_pixels(images: Sequence[Any], spec: ModelSpec) -> torch.Tensor:
    """Images -> ``[B, 3, H, W]`` uint8 after the model's resize and centre crop: the first half of
    :func:`preprocess_images`, a quarter of its bytes to send between processes or to a GPU."""
    arrays = _frames(images, spec)
    sizes = sorted({a.shape[:2] for a in arrays})
    if len(sizes) > 1:
        listed = ", ".join(f"{h}x{w}" for h, w in sizes)
        raise VitscopeValueError(f"these images keep their aspect ratios ({spec.name}: at most {spec.max_tokens} "
                                 f"patches each) and make {len(sizes)} input sizes ({listed} px), which are not one "
                                 "tensor; preprocess them one at a time, or group them with "
                                 "vitscope.models.preprocess.pixel_groups")
    return _stacked(arrays)


#: the images of one batch that share an input size: their positions in the batch and ``[b, 3, H, W]`` pixels
PixelGroup = tuple[list[int], torch.Tensor]


def pixel_groups(images: Sequence[Any], spec: ModelSpec) -> list[PixelGroup]:
    """:func:`resized_pixels` for images of several input sizes (a token budget, ``spec.max_tokens``): one uint8
    ``[b, 3, H, W]`` tensor per size, with the positions of its images, in the order each size first appears."""
    arrays = _frames(images, spec)
    groups: dict[tuple[int, ...], list[int]] = {}
    for j, a in enumerate(arrays):
        groups.setdefault(a.shape[:2], []).append(j)
    return [(positions, _stacked([arrays[j] for j in positions])) for positions in groups.values()]


def normalise_pixels(pixels: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    """``[B, 3, H, W]`` uint8 -> float32 ``(x / 255 - mean) / std`` on the pixels' device: the second half of
    :func:`preprocess_images` (float32 operations, correctly rounded on CPU and GPU alike: the same bits)."""
    mean = torch.tensor(spec.mean, dtype=torch.float32, device=pixels.device).view(1, 3, 1, 1)
    std = torch.tensor(spec.std, dtype=torch.float32, device=pixels.device).view(1, 3, 1, 1)
    # a tensor divisor, not the number 255: CUDA divides by a number as a product with its reciprocal,
    # which rounds differently from the CPU's division
    scale = torch.tensor(255.0, dtype=torch.float32, device=pixels.device)
    return (pixels.float() / scale - mean) / std
