"""Localisation scores of an explanation map against an object mask (pure maths; the benchmark that uses them is
``vitscope explanations``). Maps and masks share one grid: upsample the map (or reduce the mask) first.

- Pointing game (Zhang et al. 2018): the map's maximum lies inside the object.
- Relevance mass (Arras et al. 2022): the share of the map's positive relevance inside the object.
- AUROC: how well the map's values rank object pixels above background pixels (0.5 = chance), by
  scikit-learn's ``roc_auc_score``.
- Segmentation scores of the ImageNet-segmentation benchmark (Chefer et al. 2021, after Gur et al.; their
  ``imagenet_seg_eval.py`` and ``utils/metrices.py``): each map min-max scaled to [0, 1] and thresholded at its
  mean gives a foreground prediction; pixel accuracy and the mean IoU of the two classes (background, object)
  over the images' summed intersections and unions; the mean over all images of the average precision of the
  two-channel prediction ``(1 - map, map)`` against the one-hot mask ``(background, object)``, both channels
  ranked together (a flat map scores 0 in both channels, so 0.5).
"""

from __future__ import annotations

import numpy as np
import torch

from vitscope.errors import VitscopeValueError

__all__ = ["mask_auroc", "pointing_game", "relevance_mass", "segmentation_scores"]


def _check(maps: torch.Tensor, masks: torch.Tensor) -> None:
    if maps.dim() != 3 or maps.shape != masks.shape:
        raise VitscopeValueError(f"maps [B, h, w] and masks of the same shape needed, got {tuple(maps.shape)} and "
                                 f"{tuple(masks.shape)}")


def pointing_game(maps: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """``[B]`` bool: the (first, row-major) maximum of each map falls inside its mask.

    Args:
        maps: ``[B, h, w]`` explanation maps.
        masks: ``[B, h, w]`` bool object masks.
    """
    _check(maps, masks)
    flat = maps.reshape(maps.shape[0], -1)
    return masks.reshape(masks.shape[0], -1).bool().gather(1, flat.argmax(dim=1, keepdim=True))[:, 0]


def relevance_mass(maps: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """``[B]`` float64: positive relevance inside the mask / all positive relevance (NaN for a map with none)."""
    _check(maps, masks)
    positive = maps.double().clamp(min=0).reshape(maps.shape[0], -1)
    inside = (positive * masks.reshape(masks.shape[0], -1).double()).sum(dim=1)
    total = positive.sum(dim=1)
    return torch.where(total > 0, inside / total.clamp(min=1e-300), torch.full_like(total, float("nan")))


def mask_auroc(maps: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """``[B]`` float64: the area under the ROC curve of each map's values as a score of its mask (NaN when the mask
    is empty or full: no ranking to measure)."""
    from sklearn.metrics import roc_auc_score

    _check(maps, masks)
    out = []
    for m, y in zip(maps.detach().cpu().double().numpy(), masks.detach().cpu().bool().numpy()):
        labels = y.reshape(-1)
        out.append(roc_auc_score(labels, m.reshape(-1)) if 0 < labels.sum() < labels.size else np.nan)
    return torch.as_tensor(np.asarray(out, dtype=np.float64))


def segmentation_scores(maps: torch.Tensor, masks: torch.Tensor) -> dict[str, float]:
    """``{"pixel_accuracy", "miou", "map"}`` of maps against object masks (the module docstring's protocol, as
    Chefer et al.'s evaluation computes it).

    Args:
        maps: ``[B, H, W]`` explanation maps at the masks' resolution.
        masks: ``[B, H, W]`` bool object masks.
    """
    from sklearn.metrics import average_precision_score

    _check(maps, masks)
    m = maps.detach().cpu().double()
    low = m.flatten(1).min(1).values.view(-1, 1, 1)
    high = m.flatten(1).max(1).values.view(-1, 1, 1)
    scaled = torch.where(high > low, (m - low) / (high - low).clamp(min=1e-300), torch.zeros_like(m))
    predicted = scaled > scaled.flatten(1).mean(1).view(-1, 1, 1)
    truth = masks.detach().cpu().bool()
    correct = int((predicted == truth).sum())
    inter = [int((predicted & truth).sum()), int((~predicted & ~truth).sum())]  # object, background
    union = [int((predicted | truth).sum()), int((~predicted | ~truth).sum())]
    # 1 - scaled, written so that values the same distance from either end tie exactly (1 - 1/3 != 2/3 in floats);
    # a flat map is the reference's 0/0: NaN in both channels, set to 0
    below = torch.where(high > low, (high - m) / (high - low).clamp(min=1e-300), torch.zeros_like(m))
    channels = torch.stack([below, scaled], dim=1)  # [B, 2, H, W]
    onehot = torch.stack([~truth, truth], dim=1)
    ap = [average_precision_score(t.reshape(-1).numpy(), s.reshape(-1).numpy()) for s, t in zip(channels, onehot)]
    return {"pixel_accuracy": correct / truth.numel(),
            "miou": float(np.mean([i / u for i, u in zip(inter, union) if u])),
            "map": float(np.mean(ap))}
