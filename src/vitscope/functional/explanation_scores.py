"""Localisation scores of an explanation map against an object mask (pure maths; the benchmark that uses them is
issue 37's ``vitscope explanations``). Maps and masks share one grid: upsample the map (or reduce the mask) first.

- Pointing game (Zhang et al. 2018): the map's maximum lies inside the object.
- Relevance mass (Arras et al. 2022): the share of the map's positive relevance inside the object.
- AUROC: how well the map's values rank object pixels above background pixels (0.5 = chance), by
  scikit-learn's ``roc_auc_score``.
"""

from __future__ import annotations

import numpy as np
import torch

from vitscope.errors import VitscopeValueError

__all__ = ["mask_auroc", "pointing_game", "relevance_mass"]


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
