"""Video object segmentation scores as the official DAVIS 2017 evaluation (docs/methods.md, Probes per block).

Pure functions: no I/O, no plotting, no global state. J is the region IoU, F the boundary F-measure
of ``davis2017/metrics.py`` (``db_eval_iou`` and ``f_measure``): one-pixel boundaries from the
``seg2bmap`` logic, matched within ``ceil(0.008 * image diagonal)`` pixels by dilating with a disk:
``cv2.dilate`` with ``skimage.morphology.disk(bound_pix)``, as the official code, so a fractional pixel
tolerance (``bound_th=2.5``) gives the official even-sized kernel with OpenCV's anchor too.
"""

from __future__ import annotations

import numpy as np
import torch

from vitscope.errors import VitscopeValueError

__all__ = ["boundary_map", "davis_f", "davis_j"]

MaskLike = np.ndarray | torch.Tensor


def _mask(mask: MaskLike, name: str) -> np.ndarray:
    if isinstance(mask, torch.Tensor):
        mask = mask.detach().cpu().numpy()
    arr = np.asarray(mask)
    if arr.ndim != 2:
        raise VitscopeValueError(f"{name} must be a 2-D mask [H, W], got shape {arr.shape}")
    return arr != 0


def _pair(pred: MaskLike, true: MaskLike) -> tuple[np.ndarray, np.ndarray]:
    p, t = _mask(pred, "pred_mask"), _mask(true, "true_mask")
    if p.shape != t.shape:
        raise VitscopeValueError(f"pred_mask {p.shape} and true_mask {t.shape} must have the same shape")
    return p, t


def davis_j(pred_mask: MaskLike, true_mask: MaskLike) -> float:
    """Region similarity J: intersection over union of two binary masks.

    Args:
        pred_mask: ``[H, W]`` predicted mask (nonzero = object), numpy or torch.
        true_mask: ``[H, W]`` ground-truth mask.

    Returns:
        IoU in [0, 1]; 1.0 when both masks are empty (as the official code).
    """
    p, t = _pair(pred_mask, true_mask)
    union = np.count_nonzero(p | t)
    if union == 0:
        return 1.0
    return float(np.count_nonzero(p & t) / union)


def boundary_map(mask: MaskLike) -> np.ndarray:
    """One-pixel-wide boundary map of a binary mask (the ``seg2bmap`` logic at full size).

    A pixel is a boundary pixel when it differs from its east, south or south-east neighbour; the
    last row only compares east, the last column only south, and the bottom-right pixel is never a
    boundary pixel. Boundaries sit half a pixel towards the origin from the true segment boundary.

    Args:
        mask: ``[H, W]`` binary mask (nonzero = object), numpy or torch.

    Returns:
        ``[H, W]`` bool boundary map.
    """
    seg = _mask(mask, "mask")
    east = np.zeros_like(seg)
    south = np.zeros_like(seg)
    south_east = np.zeros_like(seg)
    east[:, :-1] = seg[:, 1:]
    south[:-1, :] = seg[1:, :]
    south_east[:-1, :-1] = seg[1:, 1:]
    b = (seg ^ east) | (seg ^ south) | (seg ^ south_east)
    b[-1, :] = seg[-1, :] ^ east[-1, :]
    b[:, -1] = seg[:, -1] ^ south[:, -1]
    b[-1, -1] = False
    return b


def davis_f(pred_mask: MaskLike, true_mask: MaskLike, bound_th: float = 0.008) -> float:
    """Boundary F-measure as the official DAVIS 2017 ``f_measure``.

    Tolerance ``bound_pix = ceil(bound_th * ||(H, W)||)`` pixels (``bound_th >= 1`` is taken as pixels
    directly). Each boundary map is dilated by a disk of that radius; precision = predicted boundary
    pixels within the dilated true boundary / predicted boundary pixels, recall = true boundary pixels
    within the dilated predicted boundary / true boundary pixels, ``F = 2PR / (P + R)`` (0 when P + R = 0).
    Both boundaries empty -> 1.0; exactly one empty -> 0.0.

    Args:
        pred_mask: ``[H, W]`` predicted mask (nonzero = object), numpy or torch.
        true_mask: ``[H, W]`` ground-truth mask.
        bound_th: tolerance as a fraction of the image diagonal (default 0.008), or pixels if >= 1.

    Returns:
        F in [0, 1].
    """
    p, t = _pair(pred_mask, true_mask)
    if not bound_th > 0:
        raise VitscopeValueError(f"bound_th must be > 0, got {bound_th!r}")
    bound_pix = bound_th if bound_th >= 1 else np.ceil(bound_th * np.linalg.norm(p.shape))
    fg_boundary, gt_boundary = boundary_map(p), boundary_map(t)
    n_fg, n_gt = np.count_nonzero(fg_boundary), np.count_nonzero(gt_boundary)
    if n_fg == 0 and n_gt == 0:
        return 1.0
    if n_fg == 0 or n_gt == 0:
        return 0.0  # precision 1 / recall 0 or the reverse: F = 0
    import cv2  # imported here: OpenCV and scikit-image cost start-up time for every command
    from skimage.morphology import disk

    footprint = disk(bound_pix).astype(np.uint8)  # as the official code: a float radius stays a float
    fg_dil = cv2.dilate(fg_boundary.astype(np.uint8), footprint) > 0
    gt_dil = cv2.dilate(gt_boundary.astype(np.uint8), footprint) > 0
    precision = np.count_nonzero(fg_boundary & gt_dil) / n_fg
    recall = np.count_nonzero(gt_boundary & fg_dil) / n_gt
    if precision + recall == 0:
        return 0.0
    return float(2 * precision * recall / (precision + recall))
