"""Video label propagation as the DINO ``eval_video_segmentation.py`` code (docs/methods.md, Probes per block).

Pure tensor functions: no I/O, no plotting, no global state. One step, for a target frame:

1. L2-normalise target and context tokens; affinity ``exp(sim / temperature)`` between every target
   token and every context token of every context frame;
2. zero the affinity outside a square window of Chebyshev radius ``radius`` tokens;
3. per target token, keep the context entries (jointly over all context frames) at least as large as the
   ``topk``-th largest (ties kept, as the code's ``aff[aff < min_topk] = 0``), divide by their sum
   (= softmax of ``sim / temperature`` over the kept entries);
4. the target's soft labels are the weighted sum of the context frames' soft labels.

:func:`labels_to_mask` turns soft labels into the frame's mask as the code does: bilinear upsampling by
the patch size (``align_corners=False``), per-channel min-max normalisation, argmax, and a nearest resize
(PIL) to the frame size.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from vitscope.errors import VitscopeValueError

__all__ = ["first_frame_labels", "labels_to_mask", "neighborhood_mask", "propagate_labels"]


def neighborhood_mask(grid: tuple[int, int], radius: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``[K, K]`` bool, True where two tokens of an ``h x w`` grid are within Chebyshev distance ``radius``."""
    h, w = grid
    rows = torch.arange(h, device=device).repeat_interleave(w)
    cols = torch.arange(w, device=device).repeat(h)
    return ((rows[:, None] - rows[None, :]).abs() <= radius) & ((cols[:, None] - cols[None, :]).abs() <= radius)


def propagate_labels(
    target: torch.Tensor,
    context: torch.Tensor,
    context_labels: torch.Tensor,
    grid: tuple[int, int],
    topk: int = 5,
    radius: int = 12,
    temperature: float = 0.1,
    chunk: int = 4096,
) -> torch.Tensor:
    """Soft labels of the target frame's tokens from the context frames (one DINO propagation step).

    Args:
        target: ``[K, D]`` target-frame tokens (row-major ``h x w`` grid).
        context: ``[C, K, D]`` tokens of the context frames (first frame and the previous ones).
        context_labels: ``[C, M, K]`` soft labels of the context frames (M channels incl. background).
        grid: ``(h, w)`` with ``h * w = K``.
        topk: context entries kept per target token (jointly over the frames), default 5.
        radius: neighbourhood radius in tokens (Chebyshev); a negative value disables the window.
        temperature: affinity temperature, default 0.1.
        chunk: target tokens per chunk (bounds memory to ``C * K * chunk`` affinities).

    Returns:
        ``[M, K]`` soft labels of the target tokens (float32).
    """
    if target.dim() != 2 or context.dim() != 3 or context.shape[1:] != target.shape:
        raise VitscopeValueError(f"target [K, D] and context [C, K, D] must match, got {tuple(target.shape)} and "
                                 f"{tuple(context.shape)}")
    c, k, _ = context.shape
    if context_labels.dim() != 3 or context_labels.shape[0] != c or context_labels.shape[2] != k:
        raise VitscopeValueError(f"context_labels must be [C={c}, M, K={k}], got {tuple(context_labels.shape)}")
    if grid[0] * grid[1] != k:
        raise VitscopeValueError(f"grid {grid} does not hold {k} tokens")
    tgt = F.normalize(target.float(), dim=1)
    src = F.normalize(context.float(), dim=2).reshape(c * k, -1)  # [C*K, D], context frame-major
    labels = context_labels.float().permute(1, 0, 2).reshape(context_labels.shape[1], c * k)  # [M, C*K]
    window = neighborhood_mask(grid, radius, tgt.device) if radius >= 0 else None
    out = []
    for start in range(0, k, chunk):
        logits = src @ tgt[start : start + chunk].T / temperature  # [C*K, q]
        if window is not None:
            logits = logits.masked_fill(~window[:, start : start + chunk].repeat(c, 1), float("-inf"))
        # less each target token's best: the same normalised affinities, without overflow at small temperatures
        aff = torch.exp(logits - logits.max(dim=0, keepdim=True).values)
        kth = aff.topk(min(topk, c * k), dim=0).values.min(dim=0).values  # [q]
        aff = torch.where(aff < kth, torch.zeros_like(aff), aff)
        aff = aff / aff.sum(dim=0, keepdim=True)
        out.append(labels @ aff)
    return torch.cat(out, dim=1)


def first_frame_labels(mask: np.ndarray, grid: tuple[int, int]) -> torch.Tensor:
    """One-hot soft labels of the first frame on the token grid, as the code's ``read_seg``.

    The index mask is resized to the grid with PIL's nearest filter; channels are ``0 .. max(mask)``
    (background included).

    Args:
        mask: ``[H, W]`` integer object indices (0 = background).
        grid: ``(h, w)``.

    Returns:
        ``[M, h, w]`` float32 one-hot labels, ``M = max(mask) + 1``.
    """
    arr = np.asarray(mask)
    if arr.ndim != 2:
        raise VitscopeValueError(f"mask must be [H, W], got shape {arr.shape}")
    small = np.asarray(Image.fromarray(arr.astype(np.uint8)).resize((grid[1], grid[0]), Image.Resampling.NEAREST))
    num = int(arr.max()) + 1
    return F.one_hot(torch.from_numpy(small.astype(np.int64)), num).permute(2, 0, 1).float()


def labels_to_mask(soft: torch.Tensor, patch: int, out_hw: tuple[int, int]) -> np.ndarray:
    """Soft token labels -> the frame's index mask, as the code's post-processing.

    Args:
        soft: ``[M, h, w]`` soft labels.
        patch: upsampling factor (the patch size).
        out_hw: ``(H, W)`` frame size for the final nearest resize.

    Returns:
        ``[H, W]`` uint8 object indices.
    """
    up = F.interpolate(soft[None].float(), scale_factor=patch, mode="bilinear", align_corners=False)[0]
    lo = up.amin(dim=(1, 2), keepdim=True)
    hi = up.amax(dim=(1, 2), keepdim=True)
    span = hi - lo
    # the code normalises channels whose maximum is positive; a constant channel would divide by 0: keep it
    norm = torch.where((hi > 0) & (span > 0), (up - lo) / torch.where(span > 0, span, torch.ones_like(span)), up)
    seg = norm.argmax(dim=0).to(torch.uint8).cpu().numpy()
    return np.asarray(Image.fromarray(seg).resize((out_hw[1], out_hw[0]), Image.Resampling.NEAREST))
