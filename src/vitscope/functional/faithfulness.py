"""Deletion and insertion curves for patch maps (faithfulness of explanations, beyond paper 000).

Remove (deletion) or reveal (insertion) image patches in the order of a map, most important first,
and track a score; a faithful map makes the deletion curve fall fast (small area) and the insertion
curve rise fast (large area). Pure tensor functions: the model calls live in
:mod:`vitscope.explain.faithfulness`.
"""

from __future__ import annotations

import torch

from vitscope.errors import VitscopeValueError

__all__ = ["curve_area", "patch_order", "patch_pixel_mask", "perturbation_schedule", "random_order", "step_fractions"]

MODES = ("deletion", "insertion")


def patch_order(maps: torch.Tensor) -> torch.Tensor:
    """Patches by decreasing map value: ``[B, h, w]`` or ``[B, K]`` -> ``[B, K]`` int64.

    Ties go to the lower row-major index (stable sort), so the order is deterministic.
    """
    flat = maps.flatten(1) if maps.dim() == 3 else maps
    if flat.dim() != 2:
        raise VitscopeValueError(f"maps must be [B, h, w] or [B, K], got {tuple(maps.shape)}")
    return torch.sort(flat, dim=-1, descending=True, stable=True).indices


def random_order(batch: int, num_patches: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``[batch, num_patches]`` independent random permutations (the chance baseline)."""
    return torch.argsort(torch.rand(batch, num_patches, generator=generator), dim=-1)


def _step_counts(num_patches: int, steps: int) -> torch.Tensor:
    """``[steps + 1]`` int64: how many patches step ``t`` affects, ``round(t * K / steps)``."""
    if not 1 <= steps <= num_patches:
        raise VitscopeValueError(f"steps must be in [1, {num_patches}] for {num_patches} patches, got {steps}")
    return torch.round(torch.arange(steps + 1, dtype=torch.float64) * num_patches / steps).long()


def step_fractions(num_patches: int, steps: int) -> torch.Tensor:
    """The share of the patches each step of :func:`perturbation_schedule` affects: ``[steps + 1]`` float64,
    ``round(t * K / steps) / K``, from 0 to 1 (``t / steps`` exactly when ``steps`` divides ``K``)."""
    return _step_counts(num_patches, steps).double() / num_patches


def perturbation_schedule(order: torch.Tensor, steps: int, mode: str = "deletion") -> torch.Tensor:
    """Which patches are kept at each step of a deletion or insertion curve.

    Step ``t`` (``0..steps``) affects the first ``round(t * K / steps)`` patches of ``order``: deletion
    removes them (step 0 keeps everything, the last step nothing), insertion reveals them (step 0 keeps
    nothing, the last step everything).

    Args:
        order: ``[B, K]`` patch indices, most important first (a permutation per row).
        steps: number of steps after the start (``1 <= steps <= K``).
        mode: ``"deletion"`` or ``"insertion"``.

    Returns:
        ``[B, steps + 1, K]`` bool, True where the patch shows the image.
    """
    if mode not in MODES:
        raise VitscopeValueError(f"mode must be one of {MODES}, got {mode!r}")
    b, k = order.shape
    counts = _step_counts(k, steps)  # [S+1]
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(k, device=order.device).expand(b, k))  # rank of every patch
    touched = rank.unsqueeze(1) < counts.to(order.device).view(1, -1, 1)  # [B, S+1, K]
    return ~touched if mode == "deletion" else touched


def patch_pixel_mask(keep: torch.Tensor, grid: tuple[int, int], size: tuple[int, int]) -> torch.Tensor:
    """Patch masks to pixel masks: ``[N, h*w]`` bool -> ``[N, 1, H, W]`` float (nearest, patch blocks)."""
    h, w = grid
    if keep.dim() != 2 or keep.shape[1] != h * w:
        raise VitscopeValueError(f"keep must be [N, {h * w}] for grid {grid}, got {tuple(keep.shape)}")
    m = keep.float().view(-1, 1, h, w)
    return torch.nn.functional.interpolate(m, size=tuple(size), mode="nearest")


def curve_area(curve: torch.Tensor, fractions: torch.Tensor | None = None) -> torch.Tensor:
    """Area under ``[B, S+1]`` curves over the fraction of patches in [0, 1] (trapezoids) -> ``[B]``.

    Args:
        curve: ``[B, S+1]`` the score at each step.
        fractions: ``[S+1]`` the share of patches each step affects, increasing from 0 to 1
            (:func:`step_fractions`); default evenly spaced, ``t / S``.

    Returns:
        ``[B]`` float64; the area lies between the curve's minimum and maximum.
    """
    if curve.dim() != 2 or curve.shape[1] < 2:
        raise VitscopeValueError(f"curve must be [B, S+1] with S >= 1, got {tuple(curve.shape)}")
    c = curve.double()
    if fractions is None:
        return ((c[:, 1:] + c[:, :-1]) / 2).mean(1)
    x = torch.as_tensor(fractions, dtype=torch.float64, device=c.device)
    if tuple(x.shape) != (c.shape[1],) or float(x[0]) != 0.0 or float(x[-1]) != 1.0 or bool((x.diff() < 0).any()):
        raise VitscopeValueError(f"fractions must be [{c.shape[1]}], increasing from 0 to 1, got {x.tolist()}")
    return ((c[:, 1:] + c[:, :-1]) / 2 * x.diff()).sum(1)
