"""Batched, seeded image augmentations on tensors (no torchvision).

Every function takes float images ``[B, 3, H, W]`` in [0, 1] (:func:`foreground_points` their object masks
``[B, H, W]``) and a ``torch.Generator`` and draws its per-image parameters from that generator only, so a
recipe's augmentations repeat exactly for a seed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from vitscope.errors import VitscopeValueError

__all__ = ["color_jitter", "foreground_points", "gaussian_blur", "grayscale", "random_erasing", "random_resized_crop",
           "rotate_hue", "solarize", "swap_background"]

_LUMA = (0.299, 0.587, 0.114)


def _uniform(n: int, low: float, high: float, gen: torch.Generator) -> torch.Tensor:
    return low + (high - low) * torch.rand(n, generator=gen)


def _chance(n: int, p: float, gen: torch.Generator) -> torch.Tensor:
    return (torch.rand(n, generator=gen) < p).view(n, 1, 1, 1)


def random_resized_crop(
    x: torch.Tensor, size: int, scale: tuple[float, float], gen: torch.Generator,
    ratio: tuple[float, float] = (3 / 4, 4 / 3), flip: float = 0.5, centre: torch.Tensor | None = None,
) -> torch.Tensor:
    """Crop a random box of each image (area fraction in ``scale``, aspect in ``ratio``), resize to ``size``.

    As torchvision's RandomResizedCrop followed by RandomHorizontalFlip(``flip``), with bilinear
    resampling through one affine grid per image (boxes are clipped to the image).

    Args:
        x: ``[B, 3, H, W]`` float images.
        size: output side (square).
        scale: range of the box area as a fraction of the image area.
        gen: random generator.
        ratio: range of the box aspect ratio (width / height), sampled log-uniformly.
        flip: probability of a horizontal flip.
        centre: optional ``[B, 2]`` box centres ``(x, y)`` in ``[-1, 1]`` image coordinates (e.g. from
            :func:`foreground_points`), moved just enough to keep each box inside the image; rows of NaN keep
            the random centre. The random centres are still drawn, so the other parameters do not depend on it.

    Returns:
        ``[B, 3, size, size]``.
    """
    b = x.shape[0]
    area = _uniform(b, *scale, gen)
    log_r = _uniform(b, math.log(ratio[0]), math.log(ratio[1]), gen)
    r = torch.exp(log_r)
    w = torch.sqrt(area * r).clamp(max=1.0)  # fraction of the image width
    h = torch.sqrt(area / r).clamp(max=1.0)
    cx = (torch.rand(b, generator=gen) * 2 - 1) * (1 - w)  # centre in [-1, 1] coordinates
    cy = (torch.rand(b, generator=gen) * 2 - 1) * (1 - h)
    if centre is not None:
        given = centre.cpu().float()
        cx = torch.where(given[:, 0].isnan(), cx, given[:, 0].clamp(w - 1, 1 - w))
        cy = torch.where(given[:, 1].isnan(), cy, given[:, 1].clamp(h - 1, 1 - h))
    sign = torch.where(torch.rand(b, generator=gen) < flip, -1.0, 1.0)
    theta = torch.zeros(b, 2, 3)
    theta[:, 0, 0], theta[:, 0, 2] = w * sign, cx
    theta[:, 1, 1], theta[:, 1, 2] = h, cy
    theta = theta.to(x.device, x.dtype)
    grid = F.affine_grid(theta, [b, 3, size, size], align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


def _gray(x: torch.Tensor) -> torch.Tensor:
    w = torch.tensor(_LUMA, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    return (x * w).sum(1, keepdim=True)


def color_jitter(
    x: torch.Tensor, gen: torch.Generator, brightness: float = 0.4, contrast: float = 0.4, saturation: float = 0.2,
    p: float = 0.8, hue: float = 0.0,
) -> torch.Tensor:
    """Scale brightness, contrast and saturation by factors in ``[1 - s, 1 + s]`` with probability ``p``.

    ``hue`` (0 to 1) also rotates every pixel's chroma by the same random angle in ``[-hue, hue] * pi``
    (a rotation of the YIQ chroma plane: luma kept). It is off by default; with it off no random numbers
    are drawn for it, so existing recipes see the same stream.
    """
    b = x.shape[0]
    fb = _uniform(b, 1 - brightness, 1 + brightness, gen).view(b, 1, 1, 1).to(x)
    fc = _uniform(b, 1 - contrast, 1 + contrast, gen).view(b, 1, 1, 1).to(x)
    fs = _uniform(b, 1 - saturation, 1 + saturation, gen).view(b, 1, 1, 1).to(x)
    apply = _chance(b, p, gen).to(x.device)
    y = (x * fb).clamp(0, 1)
    mean = _gray(y).mean(dim=(2, 3), keepdim=True)
    y = ((y - mean) * fc + mean).clamp(0, 1)
    g = _gray(y)
    y = ((y - g) * fs + g).clamp(0, 1)
    if hue > 0:
        y = rotate_hue(y, _uniform(b, -hue * math.pi, hue * math.pi, gen).to(x))
    return torch.where(apply, y, x)


_RGB_TO_YIQ = ((0.299, 0.587, 0.114), (0.596, -0.274, -0.322), (0.211, -0.523, 0.312))


def rotate_hue(x: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """Rotate the chroma of images ``[B, 3, H, W]`` (RGB in [0, 1]) by ``angle [B]`` radians (YIQ plane)."""
    to_yiq = torch.tensor(_RGB_TO_YIQ, dtype=x.dtype, device=x.device)
    cos, sin = angle.cos(), angle.sin()
    rot = torch.zeros(x.shape[0], 3, 3, dtype=x.dtype, device=x.device)
    rot[:, 0, 0] = 1
    rot[:, 1, 1], rot[:, 1, 2], rot[:, 2, 1], rot[:, 2, 2] = cos, -sin, sin, cos
    m = torch.linalg.inv(to_yiq) @ rot @ to_yiq  # [B, 3, 3]: RGB -> YIQ, rotate I/Q, back to RGB
    return torch.einsum("bij,bjhw->bihw", m, x).clamp(0, 1)


def grayscale(x: torch.Tensor, gen: torch.Generator, p: float = 0.2) -> torch.Tensor:
    """Replace an image by its luma (three equal channels) with probability ``p``."""
    apply = _chance(x.shape[0], p, gen).to(x.device)
    return torch.where(apply, _gray(x).expand_as(x), x)


def gaussian_blur(
    x: torch.Tensor, gen: torch.Generator, p: float = 0.5, sigma: tuple[float, float] = (0.1, 1.0)
) -> torch.Tensor:
    """Blur with a separable Gaussian of per-image ``sigma`` (pixels) with probability ``p``."""
    b, c, hgt, wid = x.shape
    s = _uniform(b, *sigma, gen)
    apply = _chance(b, p, gen).to(x.device)
    radius = max(1, math.ceil(3 * sigma[1]))
    t = torch.arange(-radius, radius + 1, dtype=x.dtype)
    k = torch.exp(-(t.view(1, -1) ** 2) / (2 * s.view(-1, 1).to(x.dtype) ** 2))
    k = (k / k.sum(1, keepdim=True)).to(x.device)  # [B, 2r+1]
    k = k.repeat_interleave(c, dim=0)  # one kernel per (image, channel), grouped conv
    y = F.pad(x.reshape(1, b * c, hgt, wid), (radius, radius, radius, radius), mode="reflect")
    y = F.conv2d(y, k.view(b * c, 1, 1, -1), groups=b * c)
    y = F.conv2d(y, k.view(b * c, 1, -1, 1), groups=b * c).view(b, c, hgt, wid)
    return torch.where(apply, y, x)


def solarize(x: torch.Tensor, gen: torch.Generator, p: float = 0.2, threshold: float = 0.5) -> torch.Tensor:
    """Invert pixels above ``threshold`` with probability ``p`` per image."""
    apply = _chance(x.shape[0], p, gen).to(x.device)
    return torch.where(apply & (x >= threshold), 1 - x, x)


def random_erasing(
    x: torch.Tensor, gen: torch.Generator, p: float = 0.25, scale: tuple[float, float] = (0.02, 1 / 3),
    ratio: tuple[float, float] = (0.3, 3.3),
) -> torch.Tensor:
    """Replace one random box of each image by uniform noise with probability ``p`` (DeiT's random erasing).

    As timm's ``RandomErasing(mode="pixel", max_count=1)``, except that the noise is uniform in pixel space
    ([0, 1], before normalisation) rather than standard normal after it. The box area is a fraction in
    ``scale`` of the image, its aspect (height / width) log-uniform in ``ratio``; boxes are clipped to the
    image.

    Args:
        x: ``[B, 3, H, W]`` float images in [0, 1].
        gen: random generator.
        p: probability that an image is erased.
        scale, ratio: box area fraction and aspect ranges.

    Returns:
        ``[B, 3, H, W]``.
    """
    b, c, hgt, wid = x.shape
    area = _uniform(b, *scale, gen) * hgt * wid
    aspect = torch.exp(_uniform(b, math.log(ratio[0]), math.log(ratio[1]), gen))
    bh = torch.sqrt(area * aspect).round().clamp(1, hgt)
    bw = torch.sqrt(area / aspect).round().clamp(1, wid)
    top = (torch.rand(b, generator=gen) * (hgt - bh + 1)).floor()
    left = (torch.rand(b, generator=gen) * (wid - bw + 1)).floor()
    noise = torch.rand(b, c, hgt, wid, generator=gen).to(x)
    apply = _chance(b, p, gen)
    rows, cols = torch.arange(hgt), torch.arange(wid)
    inside_r = (rows[None] >= top[:, None]) & (rows[None] < (top + bh)[:, None])  # [B, H]
    inside_c = (cols[None] >= left[:, None]) & (cols[None] < (left + bw)[:, None])  # [B, W]
    box = (inside_r[:, :, None] & inside_c[:, None, :]) & apply.view(b, 1, 1)
    return torch.where(box[:, None].to(x.device), noise, x)


def foreground_points(foreground: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One uniformly drawn foreground pixel per image, as a crop centre for :func:`random_resized_crop`.

    Object-aware cropping (Mishra et al. 2022, "Object-aware cropping for self-supervised learning"): a
    small crop centred on an object pixel always shows part of an object, where a uniformly placed one
    often shows background only.

    Args:
        foreground: ``[B, H, W]`` bool (or 0/1) masks.
        gen: random generator.

    Returns:
        ``[B, 2]`` float CPU centres ``(x, y)`` of the drawn pixels in ``[-1, 1]`` coordinates (pixel centres,
        as ``grid_sample`` with ``align_corners=False``); NaN for an image without foreground, which
        :func:`random_resized_crop` then places at random.
    """
    if foreground.dim() != 3:
        raise VitscopeValueError(f"foreground must be [B, H, W], got {tuple(foreground.shape)}")
    b, h, w = foreground.shape
    weights = foreground.reshape(b, h * w).float().cpu()
    empty = weights.sum(1) == 0
    index = torch.multinomial(torch.where(empty[:, None], 1.0, weights), 1, generator=gen).squeeze(1)
    rows, cols = index // w, index % w
    points = torch.stack([(2 * cols.float() + 1) / w - 1, (2 * rows.float() + 1) / h - 1], dim=1)
    return points.masked_fill(empty[:, None], float("nan"))


def swap_background(x: torch.Tensor, foreground: torch.Tensor, gen: torch.Generator, p: float = 1.0) -> torch.Tensor:
    """Give each image, with probability ``p``, the background of another image of the batch.

    Background augmentation for self-supervised views (Ryali et al. 2021, "Characterizing and improving
    the robustness of self-supervised learning through background augmentation", BG_Swaps): the pixels
    outside an image's foreground mask are taken from image ``(i - s) mod B`` of the batch, with one random
    shift ``1 <= s < B`` per call, so an image never receives its own background. Two views that swap
    independently then share their objects but not their background.

    Args:
        x: ``[B, 3, H, W]`` float images in [0, 1].
        foreground: ``[B, H, W]`` bool (or 0/1) masks of the objects to keep.
        gen: random generator.
        p: probability that an image's background is replaced.

    Returns:
        ``[B, 3, H, W]``; unchanged when ``B < 2``.
    """
    b = x.shape[0]
    if foreground.shape != (b, *x.shape[2:]):
        raise VitscopeValueError(f"foreground must be [B, H, W] = {(b, *x.shape[2:])}, got {tuple(foreground.shape)}")
    if b < 2:
        return x
    shift = int(torch.randint(1, b, (1,), generator=gen))
    apply = _chance(b, p, gen).to(x.device)
    keep = foreground.to(device=x.device, dtype=torch.bool).unsqueeze(1) | ~apply
    return torch.where(keep, x, x.roll(shift, dims=0))
