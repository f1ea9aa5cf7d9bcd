"""The published augmentation ensemble of paper 001: GS(CS(Jitter(x))) on copies of each image.

Defaults follow the published code (docs/methods.md, Feature visualisation); the paper's text variants are options.
Random draws come from a CPU ``torch.Generator`` so the same seed gives the same images on any device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vitscope.errors import VitscopeValueError

__all__ = ["AugmentConfig", "augment", "max_shift"]


@dataclass(frozen=True)
class AugmentConfig:
    """Augmentation settings.

    Attributes:
        copies: augmented copies of every image per step (8 in the paper).
        jitter: largest circular shift in pixels at 224 px, scaled with the input size (32).
        jitter_mode: ``"shared"`` (the code: one roll for all copies) or ``"per_copy"`` (one roll per image).
        color_shift: ``"code"`` ``(x - mu) / sigma`` or ``"paper"`` ``sigma * x + mu``; ``mu ~ U(-1, 1)`` and
            ``sigma = exp(U(-1, 1))`` per image and channel; ``"none"`` to switch it off.
        noise: ``"channel"`` (the code: an additive constant per image and channel) or ``"pixel"`` (the paper's
            text: per-pixel Gaussian noise) or ``"none"``.
        noise_std: noise standard deviation at step 0, annealed linearly to 0 at the last step (0.5; a run of
            one step keeps it).
    """

    copies: int = 8
    jitter: float = 32.0
    jitter_mode: str = "shared"
    color_shift: str = "code"
    noise: str = "channel"
    noise_std: float = 0.5

    def __post_init__(self) -> None:
        if self.copies < 1:
            raise VitscopeValueError(f"copies must be >= 1, got {self.copies}")
        for field, value, allowed in (("jitter_mode", self.jitter_mode, ("shared", "per_copy")),
                                      ("color_shift", self.color_shift, ("code", "paper", "none")),
                                      ("noise", self.noise, ("channel", "pixel", "none"))):
            if value not in allowed:
                raise VitscopeValueError(f"{field} must be one of {', '.join(allowed)}; got {value!r}")


def max_shift(jitter: float, size: tuple[int, int]) -> tuple[int, int]:
    """Largest shift per axis: ``jitter`` pixels at 224 px, scaled with the input height and width."""
    return tuple(int(round(jitter * s / 224.0)) for s in size)  # type: ignore[return-value]


def _roll(x: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    """Roll every image ``[B, C, H, W]`` by its own ``shifts [B, 2]`` (dy, dx)."""
    if bool((shifts == shifts[0]).all()):
        return torch.roll(x, shifts=(int(shifts[0, 0]), int(shifts[0, 1])), dims=(-2, -1))
    return torch.stack([torch.roll(img, shifts=(int(s[0]), int(s[1])), dims=(-2, -1)) for img, s in zip(x, shifts)])


def augment(images: torch.Tensor, step: int, steps: int, gen: torch.Generator, cfg: AugmentConfig) -> torch.Tensor:
    """Augmented copies of every image for one optimisation step.

    Args:
        images: ``[U, 3, H, W]`` pixels in [0, 1] (one image per unit being visualised).
        step: 0-based step, for the noise annealing ``std * (1 - step / (steps - 1))``: 0 at the last step.
        steps: total steps.
        gen: CPU generator for every random draw.
        cfg: the augmentation settings.

    Returns:
        ``[U * copies, 3, H, W]``; copies of unit ``u`` are rows ``u * copies .. (u + 1) * copies - 1``.
    """
    u, c, h, w = images.shape
    n = u * cfg.copies
    x = images.repeat_interleave(cfg.copies, dim=0)
    my, mx = max_shift(cfg.jitter, (h, w))
    rows = 1 if cfg.jitter_mode == "shared" else n
    dy = torch.randint(-my, my + 1, (rows, 1), generator=gen)
    dx = torch.randint(-mx, mx + 1, (rows, 1), generator=gen)
    if my or mx:
        x = _roll(x, torch.cat([dy, dx], dim=1).expand(n, 2))
    if cfg.color_shift != "none":
        mu = (torch.rand(n, c, 1, 1, generator=gen) * 2 - 1).to(x)
        sigma = (torch.rand(n, c, 1, 1, generator=gen) * 2 - 1).exp().to(x)
        x = (x - mu) / sigma if cfg.color_shift == "code" else sigma * x + mu
    std = cfg.noise_std * (1.0 - step / max(steps - 1, 1))
    if cfg.noise != "none" and std > 0 and math.isfinite(std):
        shape = (n, c, 1, 1) if cfg.noise == "channel" else (n, c, h, w)
        x = x + (torch.randn(shape, generator=gen) * std).to(x)
    return x
