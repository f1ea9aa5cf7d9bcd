"""Guided MAE masking by SIFT keypoint patches (paper 003 section 5.2; docs/methods.md, SIFT patch interrelation).

``M = floor(ratio * K + 0.5)`` patches are masked, of which ``floor(rho * M + 0.5)`` are keypoint patches
(``n_j > 0``) drawn at random within their group and the rest non-keypoint patches; when a group has too
few patches the remainder spills over to the other group. ``rho = 0`` masks only non-keypoint patches
(the easiest task), ``rho = 1`` only keypoint patches. A curriculum raises ``rho`` during pretraining.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vitscope.errors import VitscopeValueError
from vitscope.functional.occlusion import round_half_up

__all__ = ["curriculum_rho", "guided_mask", "guided_mask_counts", "guided_visible_ids"]


def guided_mask_counts(num_keypoint: int, num_other: int, num_masked: int, rho: float) -> tuple[int, int]:
    """How many keypoint and non-keypoint patches to mask: ``(m_k, m_n)`` with ``m_k + m_n = num_masked``.

    ``m_k = floor(rho * M + 0.5)``, then spill-over when a group has too few patches.
    """
    if not 0.0 <= rho <= 1.0:
        raise VitscopeValueError(f"rho must be in [0, 1], got {rho}")
    if not 0 <= num_masked <= num_keypoint + num_other:
        raise VitscopeValueError(f"cannot mask {num_masked} of {num_keypoint + num_other} patches")
    m_k = min(round_half_up(rho * num_masked), num_keypoint)
    m_n = num_masked - m_k
    if m_n > num_other:
        m_n = num_other
        m_k = num_masked - m_n
    return m_k, m_n


def _pick(flat_counts: torch.Tensor, num_masked: int, rho: float, generator: torch.Generator) -> torch.Tensor:
    """Flat indices ``[num_masked]`` of the masked patches of one image (counts ``[K]``)."""
    key = (flat_counts > 0).cpu()
    idx_k, idx_n = key.nonzero().flatten(), (~key).nonzero().flatten()
    m_k, m_n = guided_mask_counts(len(idx_k), len(idx_n), num_masked, rho)
    perm_k = torch.randperm(len(idx_k), generator=generator)
    perm_n = torch.randperm(len(idx_n), generator=generator)
    return torch.cat([idx_k[perm_k[:m_k]], idx_n[perm_n[:m_n]]])


def guided_mask(keypoint_counts: torch.Tensor, mask_ratio: float, rho: float,
                generator: torch.Generator) -> torch.Tensor:
    """Guided mask of one image (module docstring).

    Args:
        keypoint_counts: ``[h, w]`` SIFT keypoints per patch.
        mask_ratio: fraction of the ``K = h * w`` patches to mask, in ``[0, 1]``.
        rho: share of the masked patches that are keypoint patches, in ``[0, 1]``.
        generator: seeded ``torch.Generator`` (CPU).

    Returns:
        ``[h, w]`` bool, True = masked; exactly ``floor(mask_ratio * K + 0.5)`` entries are True.
    """
    if keypoint_counts.dim() != 2:
        raise VitscopeValueError(f"keypoint_counts must be [h, w], got {tuple(keypoint_counts.shape)}")
    if not 0.0 <= mask_ratio <= 1.0:
        raise VitscopeValueError(f"mask_ratio must be in [0, 1], got {mask_ratio}")
    k = keypoint_counts.numel()
    chosen = _pick(keypoint_counts.reshape(-1), round_half_up(mask_ratio * k), rho, generator)
    mask = torch.zeros(k, dtype=torch.bool)
    mask[chosen] = True
    return mask.reshape(keypoint_counts.shape)


def guided_visible_ids(keypoint_counts: torch.Tensor, keep: int, rho: float,
                       generator: torch.Generator) -> torch.Tensor:
    """Visible patches of a batch in MAE's ``ids_keep`` form (the recipe's ``mask_fn`` contract).

    Args:
        keypoint_counts: ``[B, h, w]`` (or ``[B, K]``) keypoints per patch.
        keep: patches left visible per image; ``K - keep`` are masked.
        rho: keypoint share of the masked patches.
        generator: seeded ``torch.Generator``.

    Returns:
        ``[B, keep]`` int64 visible patch indices, ascending.
    """
    flat = keypoint_counts.reshape(keypoint_counts.shape[0], -1)
    k = flat.shape[1]
    if not 0 <= keep <= k:
        raise VitscopeValueError(f"keep must be in [0, {k}], got {keep}")
    out = []
    for counts in flat:
        masked = torch.zeros(k, dtype=torch.bool)
        masked[_pick(counts, k - keep, rho, generator)] = True
        out.append((~masked).nonzero().flatten())
    return torch.stack(out) if out else torch.zeros(0, keep, dtype=torch.long)


def curriculum_rho(epoch: int, every: int, levels: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0)) -> float:
    """Curriculum of paper 003 section 5.2: ``rho`` climbs ``levels`` one step every ``every`` epochs.

    Args:
        epoch: current epoch (0-based).
        every: epochs per level (``E``).
        levels: increasing ``rho`` values from 0 to 1; the last one holds once reached.
    """
    if every < 1:
        raise VitscopeValueError(f"every must be at least 1 epoch, got {every}")
    if not levels:
        raise VitscopeValueError("levels must not be empty")
    return float(levels[min(max(epoch, 0) // every, len(levels) - 1)])
