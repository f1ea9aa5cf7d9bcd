"""Merging running moments of disjoint samples exactly (Chan, Golub and LeVeque's parallel formula)."""

from __future__ import annotations

import torch

__all__ = ["merge_mean", "merge_moments"]


def merge_mean(n_a: float | torch.Tensor, mean_a: torch.Tensor, n_b: float | torch.Tensor,
               mean_b: torch.Tensor) -> torch.Tensor:
    """Mean of the union of two disjoint samples: ``mean_a + (mean_b - mean_a) * n_b / (n_a + n_b)``.

    Args:
        n_a, n_b: sample sizes (scalars, or tensors broadcasting against the means); ``n_a + n_b > 0``.
        mean_a, mean_b: means of the two samples, any shape.

    Returns:
        The count-weighted mean, shaped like the means.
    """
    return mean_a + (mean_b - mean_a) * (n_b / (n_a + n_b))


def merge_moments(n_a: float | torch.Tensor, mean_a: torch.Tensor, m2_a: torch.Tensor, n_b: float | torch.Tensor,
                  mean_b: torch.Tensor, m2_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and sum of squared deviations (M2) of the union of two disjoint samples (Chan et al. 1979).

    ``delta = mean_b - mean_a``; ``mean = mean_a + delta * n_b / n``;
    ``M2 = M2_a + M2_b + delta^2 * n_a * n_b / n`` with ``n = n_a + n_b > 0``.

    Returns:
        ``(mean, M2)``, shaped like the inputs.
    """
    n = n_a + n_b
    delta = mean_b - mean_a
    return mean_a + delta * (n_b / n), m2_a + m2_b + delta.square() * (n_a * n_b / n)
