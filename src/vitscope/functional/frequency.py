"""Low- and high-pass filtering in the Fourier domain (robustness sweeps, paper 001 section 5).

The 2-D spectrum of every channel is centred (``fftshift``); frequency ``(u, v)`` lies at distance
``sqrt((u - H // 2)^2 + (v - W // 2)^2)`` from the centre (the DC term), in cycles per image. A low-pass
filter keeps the frequencies within ``radius`` (inclusive), a high-pass filter the others; the real part of
the inverse transform is returned. Filter images in pixel space (``[0, 1]``), not after normalisation: the
high-pass removes the DC term, which normalisation would otherwise shift.
"""

from __future__ import annotations

import torch

from vitscope.errors import VitscopeValueError

__all__ = ["KINDS", "frequency_filter", "frequency_radius_map"]

KINDS: tuple[str, ...] = ("low", "high")


def frequency_radius_map(height: int, width: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``[H, W]`` float64 distance of every centred-spectrum cell from the DC term."""
    u = torch.arange(height, dtype=torch.float64, device=device) - height // 2
    v = torch.arange(width, dtype=torch.float64, device=device) - width // 2
    return (u[:, None] ** 2 + v[None, :] ** 2).sqrt()


def frequency_filter(images: torch.Tensor, radius: float, kind: str = "low") -> torch.Tensor:
    """Keep the frequencies within (``"low"``) or beyond (``"high"``) ``radius`` of the DC term.

    Args:
        images: ``[B, C, H, W]`` real images (pixel space).
        radius: cut-off in cycles per image (``>= 0``); a low-pass with ``radius >= sqrt((H/2)^2 + (W/2)^2)``
            returns the images unchanged (to float rounding).
        kind: ``"low"`` or ``"high"``.

    Returns:
        ``[B, C, H, W]`` filtered images, in the input's dtype.
    """
    if kind not in KINDS:
        raise VitscopeValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if radius < 0:
        raise VitscopeValueError(f"radius must be non-negative, got {radius}")
    if images.dim() != 4:
        raise VitscopeValueError(f"images must be [B, C, H, W], got {tuple(images.shape)}")
    h, w = images.shape[-2:]
    spectrum = torch.fft.fftshift(torch.fft.fft2(images.to(torch.float64)), dim=(-2, -1))
    inside = frequency_radius_map(h, w, images.device) <= radius
    keep = inside if kind == "low" else ~inside
    spectrum = spectrum * keep.to(spectrum.dtype)
    out = torch.fft.ifft2(torch.fft.ifftshift(spectrum, dim=(-2, -1))).real
    return out.to(images.dtype)
