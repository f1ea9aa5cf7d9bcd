"""Faithfulness of attribution maps: deletion and insertion curves of the model's score, the removed patches
filled by a constant (the mean colour) or by ROAD's noisy linear imputation, each beside its baselines (a random
patch order, and the map of another image: the next one of the batch).

A faithful map makes the deletion curve fall fast (small area) and the insertion curve rise fast (large area),
more so than both baselines. With the constant fill part of what a curve measures is the model's reaction to
grey squares (out of its training distribution); ROAD's fill leaves no outline to react to (Rong et al. 2022).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from vitscope.errors import VitscopeValueError
from vitscope.functional.faithfulness import (
    curve_area,
    patch_order,
    patch_pixel_mask,
    perturbation_schedule,
    random_order,
    step_fractions,
)
from vitscope.functional.imputation import noisy_linear_imputation
from vitscope.functional.keyed_seeds import keyed_generator

__all__ = ["FILLS", "ORDERS", "Faithfulness", "faithfulness"]

FILLS: tuple[str, ...] = ("mean", "road")
ORDERS: tuple[str, ...] = ("map", "random", "other_image")


@dataclass
class Faithfulness:
    """Curves and areas per patch order and mode.

    Attributes:
        fractions: ``[S+1]`` the share of patches removed (deletion) or revealed (insertion) at each step.
        curves: ``{order: {mode: [B, S+1]}}`` the score along the curve.
        areas: ``{order: {mode: [B]}}`` areas under the curves (trapezoids over the fraction).
    """

    fractions: torch.Tensor
    curves: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    areas: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)

    def summary(self) -> dict[str, dict[str, float]]:
        """Mean areas ``{order: {mode: float}}``."""
        return {o: {m: float(a.mean()) for m, a in modes.items()} for o, modes in self.areas.items()}


def _road_draws(seed: int, order: str, mode: str, images: int, shape: tuple[int, ...]) -> torch.Tensor:
    """ROAD's standard normal draws ``[images * S+1, C, H, W]``: image ``i``'s from a generator of its own, seeded by
    (seed, order, mode, i), so its curves do not depend on the other images of the call."""
    rows = []
    for i in range(images):
        rows.append(torch.randn(shape, generator=keyed_generator(seed, order, mode, i), dtype=torch.float64))
    return torch.cat(rows)


@torch.no_grad()
def faithfulness(score: Callable[[torch.Tensor], torch.Tensor], pixels: torch.Tensor, maps: torch.Tensor,
                 steps: int = 8, fill: str = "mean", modes: tuple[str, ...] = ("deletion", "insertion"),
                 seed: int = 0, noise: float = 0.01) -> Faithfulness:
    """Deletion and insertion curves of ``score`` on ``pixels`` in the order of ``maps`` and of the baselines.

    Args:
        score: ``pixels [B, 3, H, W] -> [B]`` (e.g. a classifier's logit of each image's class), called once per
            step with one perturbed copy of every image, in order.
        pixels: ``[B, 3, H, W]`` in the model's normalisation.
        maps: ``[B, h, w]`` one map per image, on a grid of patches that tiles the image.
        steps: points of a curve after the start.
        fill: ``"mean"`` (0 in the model's normalisation: the dataset's mean colour) or ``"road"``.
        modes: ``"deletion"`` and/or ``"insertion"``.
        seed: of the random order and of ROAD's noise (image ``i``'s own: its curves are the same whatever other
            images the call holds).
        noise: ROAD's noise.

    Raises:
        VitscopeValueError: an unknown fill, maps that are not one per image, a grid that does not tile the image.
    """
    if fill not in FILLS:
        raise VitscopeValueError(f"fill must be one of {', '.join(FILLS)}, got {fill!r}")
    b = pixels.shape[0]
    if maps.dim() != 3 or maps.shape[0] != b:
        raise VitscopeValueError(f"maps must be [B, h, w] with B = {b}, got {tuple(maps.shape)}")
    grid = tuple(maps.shape[-2:])
    size = tuple(pixels.shape[-2:])
    if size[0] % grid[0] or size[1] % grid[1]:
        raise VitscopeValueError(f"a {grid[0]}x{grid[1]} map does not tile a {size[0]}x{size[1]} image")
    k = grid[0] * grid[1]
    order = patch_order(maps)
    if b < 2:
        raise VitscopeValueError("the other-image baseline needs two images or more")
    orders = {"map": order, "random": random_order(b, k, torch.Generator().manual_seed(seed)),
              "other_image": order.roll(-1, 0)}
    out = Faithfulness(step_fractions(k, steps))
    for name, o in orders.items():
        out.curves[name], out.areas[name] = {}, {}
        for mode in modes:
            keep = perturbation_schedule(o, steps, mode)  # [B, S+1, K]: True where the image shows
            shown = patch_pixel_mask(keep.flatten(0, 1), grid, size)  # [B*(S+1), 1, H, W]
            images = pixels.repeat_interleave(steps + 1, 0)
            if fill == "mean":
                perturbed = images * shown
            else:
                draws = _road_draws(seed, name, mode, b, (steps + 1, *pixels.shape[1:]))
                perturbed = noisy_linear_imputation(images, shown[:, 0] < 0.5, noise, draws=draws)
            by_step = perturbed.view(b, steps + 1, *perturbed.shape[1:]).transpose(0, 1)  # one copy of each image
            curve = torch.stack([score(step) for step in by_step], dim=1).double()  # [B, S+1]
            out.curves[name][mode], out.areas[name][mode] = curve, curve_area(curve, out.fractions)
    return out
