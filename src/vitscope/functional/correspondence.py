"""Keypoint transfer by nearest dense feature, as the paper-002 SPair code (docs/methods.md, Probes per block).

Pure functions: no I/O, no plotting, no global state.

- Letterbox (the code's ``resize``): scale so the long side fills the canvas, round the short side,
  centre it with offset ``int((size - new) / 2)``; keypoints move by the same scale and offset.
- Transfer (the code's ``compute_pck``): L2-normalise the tokens, upsample bilinearly
  (``align_corners=False``) to pixel resolution; the source keypoint reads the feature at pixel
  ``(round(y), int(x))`` (the code rounds y and truncates x); the prediction is the target pixel with the
  largest dot product of these upsampled normalised features (the code does not renormalise after
  upsampling, so this is the cosine of the tokens it interpolates, not of the interpolated vectors).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from vitscope.errors import VitscopeValueError

__all__ = ["Letterbox", "letterbox_geometry", "transfer_keypoints"]


@dataclass(frozen=True)
class Letterbox:
    """Geometry of one letterboxed image: ``x' = x * scale + left``, ``y' = y * scale + top``."""

    scale: float
    new_size: tuple[int, int]  # (height, width) of the resized image inside the canvas
    top: int
    left: int

    def apply(self, xy: np.ndarray | torch.Tensor) -> np.ndarray:
        """Map ``[n, 2]`` (x, y) pixels of the original image into the canvas."""
        pts = np.asarray(xy.detach().cpu() if isinstance(xy, torch.Tensor) else xy, dtype=np.float64).reshape(-1, 2)
        return np.stack([pts[:, 0] * self.scale + self.left, pts[:, 1] * self.scale + self.top], axis=1)


def letterbox_geometry(image_hw: tuple[int, int], canvas_hw: tuple[int, int]) -> Letterbox:
    """Where an ``image_hw`` image lands in a ``canvas_hw`` letterbox (the long side fills the canvas).

    For a square canvas this is the 002 code's ``resize``/``preprocess_kps_pad`` pair: the short side is
    ``round(size * short / long)`` and is centred with offset ``int((size - new_short) / 2)``.

    Args:
        image_hw: ``(height, width)`` of the original image.
        canvas_hw: ``(H, W)`` canvas (the model input).

    Returns:
        The :class:`Letterbox`.
    """
    h, w = (int(v) for v in image_hw)
    ch, cw = (int(v) for v in canvas_hw)
    if min(h, w, ch, cw) < 1:
        raise VitscopeValueError(f"sizes must be positive, got image {image_hw} and canvas {canvas_hw}")
    if ch / h <= cw / w:  # the height fills the canvas
        scale = ch / h
        new_h, new_w = ch, int(np.around(w * scale))
    else:
        scale = cw / w
        new_h, new_w = int(np.around(h * scale)), cw
    return Letterbox(scale=scale, new_size=(new_h, new_w), top=int((ch - new_h) / 2), left=int((cw - new_w) / 2))


def transfer_keypoints(
    src_tokens: torch.Tensor, trg_tokens: torch.Tensor, src_xy: torch.Tensor | np.ndarray, out_hw: tuple[int, int]
) -> torch.Tensor:
    """Predict the target position of every source keypoint by nearest upsampled feature.

    Args:
        src_tokens: ``[D, h, w]`` spatial tokens of the source image.
        trg_tokens: ``[D, h, w]`` spatial tokens of the target image (same grid).
        src_xy: ``[n, 2]`` source keypoints (x, y) in pixels of the ``out_hw`` frame.
        out_hw: ``(H, W)`` pixel resolution the tokens are upsampled to (the letterboxed input).

    Returns:
        ``[n, 2]`` float64 predicted (x, y) target pixels.
    """
    if src_tokens.dim() != 3 or src_tokens.shape != trg_tokens.shape:
        raise VitscopeValueError(f"src_tokens and trg_tokens must both be [D, h, w], got {tuple(src_tokens.shape)} and "
                                 f"{tuple(trg_tokens.shape)}")
    big_h, big_w = (int(v) for v in out_hw)
    pts = torch.as_tensor(np.asarray(src_xy, dtype=np.float64)).reshape(-1, 2)
    if pts.shape[0] == 0:
        return torch.zeros((0, 2), dtype=torch.float64)
    feats = F.normalize(torch.stack([src_tokens, trg_tokens]).float(), dim=1)
    feats = F.interpolate(feats, size=(big_h, big_w), mode="bilinear", align_corners=False)  # [2, D, H, W]
    src, trg = feats[0].reshape(feats.shape[1], -1), feats[1].reshape(feats.shape[1], -1)  # [D, H*W]
    ys = torch.round(pts[:, 1]).long().clamp(0, big_h - 1)
    xs = pts[:, 0].long().clamp(0, big_w - 1)  # truncation, as the code's astype(int32)
    sims = src[:, ys * big_w + xs].T @ trg  # [n, H*W]
    best = sims.argmax(dim=1)
    return torch.stack([best % big_w, best // big_w], dim=1).to(torch.float64)
