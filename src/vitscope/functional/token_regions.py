"""Which region (object, part, or background) each token of a grid shows, from the regions' coverage of its pixels."""

from __future__ import annotations

import torch

__all__ = ["BACKGROUND", "token_coverage", "token_region_labels"]

#: the label of a token that no region covers by a majority
BACKGROUND = -1


def token_coverage(masks: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """The share of every token's pixels inside each region: ``[n, H, W]`` bool -> ``[n, h * w]`` float32.

    The frame is averaged over the ``h x w`` grid (exact shares when ``H`` and ``W`` are multiples of the grid, as
    a patch grid over the model's input; an area average otherwise).
    """
    h, w = (int(v) for v in grid)
    if masks.shape[0] == 0:
        return torch.zeros(0, h * w)
    pooled = torch.nn.functional.adaptive_avg_pool2d(masks.float()[:, None], (h, w))  # [n, 1, h, w]
    return pooled.reshape(masks.shape[0], h * w)


def token_region_labels(coverage: torch.Tensor, labels: torch.Tensor, majority: float = 0.5) -> torch.Tensor:
    """Every token's region label: the label of the region covering most of its pixels when it covers more than
    ``majority`` of them, else :data:`BACKGROUND`.

    Args:
        coverage: ``[n, K]`` shares (:func:`token_coverage`); labels: ``[n]`` int label of each region.
        majority: the share a region needs.

    Returns:
        ``[K]`` int64.
    """
    k = coverage.shape[-1]
    if coverage.shape[0] == 0:
        return torch.full((k,), BACKGROUND, dtype=torch.int64)
    best, which = coverage.max(dim=0)
    out = torch.as_tensor(labels, dtype=torch.int64)[which]
    return torch.where(best > majority, out, torch.full_like(out, BACKGROUND))
