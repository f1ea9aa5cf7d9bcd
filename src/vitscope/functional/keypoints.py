"""Percentage of correct keypoints (docs/methods.md, Probes per block, "Keypoint correspondence").

Pure functions: no I/O, no plotting, no global state.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from vitscope.errors import VitscopeValueError

__all__ = ["pck"]


def _float64(x: torch.Tensor | np.ndarray | float | int) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().to(torch.float64)
    return torch.as_tensor(np.asarray(x, dtype=np.float64))


def pck(
    pred_xy: torch.Tensor | np.ndarray,
    true_xy: torch.Tensor | np.ndarray,
    bbox_size: torch.Tensor | np.ndarray | float,
    alpha: float,
) -> float:
    """Fraction of keypoints whose prediction lies strictly closer than ``alpha * bbox_size``.

    A keypoint is correct when ``||pred - true||_2 < alpha * bbox_size`` (strictly less, as the 002
    code; a distance exactly at the threshold is wrong). The caller chooses the normaliser (target box
    ``max(h, w)`` by default in vitscope, or the image size) and pools keypoints as it wishes.

    Args:
        pred_xy: ``[n, 2]`` predicted (x, y) pixel positions.
        true_xy: ``[n, 2]`` ground-truth (x, y) pixel positions.
        bbox_size: ``[n]`` per-keypoint normaliser, or a scalar for all.
        alpha: threshold factor, e.g. 0.1, 0.05 or 0.01.

    Returns:
        PCK in [0, 1]; NaN when n == 0.
    """
    pred, true = _float64(pred_xy), _float64(true_xy)
    if pred.dim() != 2 or pred.shape[-1] != 2 or pred.shape != true.shape:
        raise VitscopeValueError(f"pred_xy and true_xy must both be [n, 2], got {tuple(pred.shape)} and "
                                 f"{tuple(true.shape)}")
    size = _float64(bbox_size)
    n = pred.shape[0]
    if size.dim() > 1 or (size.dim() == 1 and size.numel() != n):
        raise VitscopeValueError(f"bbox_size must be a scalar or [n={n}], got shape {tuple(size.shape)}")
    if not alpha > 0:
        raise VitscopeValueError(f"alpha must be > 0, got {alpha!r}")
    if n == 0:
        return math.nan
    dist = torch.linalg.vector_norm(pred - true, dim=1)
    correct = dist < alpha * size
    return float(correct.to(torch.float64).mean())
