"""Weighted SIFT patch interrelation (paper 003 sections 3 and 4; docs/methods.md, SIFT patch interrelation).

Paper 003's equations 2 to 4 did not survive in its text; vitscope uses the reconstruction of
docs/methods.md, SIFT patch interrelation:

* attended set of spatial query ``i`` in one head, on the spatial attention (prefix dropped, rows
  renormalised): keys ``j`` with ``a_ij > lam * max_j a_ij`` (rule ``"max"``, default) or
  ``a_ij > lam / K`` (rule ``"uniform"``);
* weighted interrelation of query ``i``: ``P_i = sum_{j in S_i, n_j > 0} n_j /
  (sum_{j in S_i, n_j > 0} n_j + |{j in S_i : n_j = 0}|)`` with ``n_j`` the SIFT keypoints of patch ``j``;
* ``KK`` = mean of ``P_i`` over keypoint queries (``n_i > 0``), ``NK`` = mean over non-keypoint queries,
  ``KN = 1 - KK``, ``NN = 1 - NK``.

A query whose attended set is empty (a spatial row with no mass, or ``lam >= 1`` under ``"uniform"``) has
``P_i = NaN`` and is left out of the means.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vitscope.errors import VitscopeValueError
from vitscope.functional.attention import spatial_attention
from vitscope.functional.image_groups import images_per_group

__all__ = ["RULES", "interrelation", "interrelation_patch_scores", "interrelation_stages", "patch_interrelation"]

RULES: tuple[str, ...] = ("max", "uniform")


def _check(pattern: torch.Tensor, counts: torch.Tensor, grid: Sequence[int], num_prefix: int,
           lam: float, rule: str) -> tuple[int, int]:
    if rule not in RULES:
        raise VitscopeValueError(f"rule must be one of {RULES}, got {rule!r}")
    if not lam >= 0:
        raise VitscopeValueError(f"lam must be a non-negative number, got {lam}")
    if not isinstance(pattern, torch.Tensor) or pattern.dim() != 4 or pattern.shape[-1] != pattern.shape[-2]:
        raise VitscopeValueError(f"pattern must be [B, H, N, N], got {tuple(getattr(pattern, 'shape', ()))}")
    h, w = (int(v) for v in grid)
    if int(num_prefix) + h * w != pattern.shape[-1]:
        raise VitscopeValueError(f"the pattern has N = {pattern.shape[-1]} tokens but grid {h}x{w} plus {num_prefix} "
                                 f"prefix tokens makes {int(num_prefix) + h * w}")
    if tuple(counts.shape) != (pattern.shape[0], h, w):
        raise VitscopeValueError(f"keypoint_counts must be [B, h, w] = {[pattern.shape[0], h, w]}, got "
                                 f"{list(counts.shape)}")
    return h, w


def attended_sets(spatial: torch.Tensor, lam: float = 0.5, rule: str = "max") -> torch.Tensor:
    """Boolean attended sets ``[..., K, K]`` of a spatial attention ``[..., K, K]`` (rows summing to 1 or 0)."""
    if rule == "max":
        return spatial > lam * spatial.amax(dim=-1, keepdim=True)
    return spatial > lam / spatial.shape[-1]


def patch_interrelation(
    pattern: torch.Tensor, keypoint_counts: torch.Tensor, grid: Sequence[int], num_prefix: int,
    lam: float = 0.5, rule: str = "max",
) -> torch.Tensor:
    """Weighted interrelation ``P_i`` of every spatial query (module docstring).

    Args:
        pattern: ``[B, H, N, N]`` post-softmax attention.
        keypoint_counts: ``[B, h, w]`` SIFT keypoints per patch (:func:`~vitscope.functional.sift_keypoint_counts`).
        grid: ``(h, w)`` with ``h * w = N - num_prefix``.
        num_prefix: prefix tokens P.
        lam: detection-line height.
        rule: ``"max"`` (``a > lam * max``) or ``"uniform"`` (``a > lam / K``).

    Returns:
        ``[B, H, K]`` float64 in ``[0, 1]``; NaN where the query's attended set is empty.
    """
    _check(pattern, keypoint_counts, grid, num_prefix, lam, rule)
    n = keypoint_counts.reshape(pattern.shape[0], -1).to(device=pattern.device, dtype=torch.float64)
    weight = torch.where(n > 0, n, torch.ones_like(n))  # a non-keypoint patch weighs 1 in the denominator
    # keypoint counts and set sizes are integers far below 2**24, so float32 sums of them are exact
    n32, weight32 = n.float(), weight.float()
    step = images_per_group(pattern[:1].numel() * 4)  # the attended sets of a whole batch would take GBs
    num, den = [], []
    for i in range(0, pattern.shape[0], step):
        sets = attended_sets(spatial_attention(pattern[i:i + step], num_prefix), lam, rule).float()
        num.append(torch.einsum("bhqk,bk->bhq", sets, n32[i:i + step]).double())
        den.append(torch.einsum("bhqk,bk->bhq", sets, weight32[i:i + step]).double())
    numerator, denominator = torch.cat(num), torch.cat(den)
    return torch.where(denominator > 0, numerator / torch.where(denominator > 0, denominator,
                                                                torch.ones_like(denominator)),
                       torch.full_like(denominator, float("nan")))


def _masked_nanmean(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Mean of ``values [B, H, K]`` over K where ``keep [B, 1, K]`` and the value is finite; NaN if none."""
    ok = keep & ~values.isnan()
    total = torch.where(ok, values, torch.zeros_like(values)).sum(dim=-1)
    count = ok.sum(dim=-1)
    return torch.where(count > 0, total / count.clamp(min=1), torch.full_like(total, float("nan")))


def interrelation(
    pattern: torch.Tensor, keypoint_counts: torch.Tensor, grid: Sequence[int], num_prefix: int,
    lam: float = 0.5, rule: str = "max",
) -> dict[str, torch.Tensor]:
    """KK, KN, NK and NN per image and head (paper 003 figures 5 and 7a).

    Args:
        pattern: ``[B, H, N, N]`` post-softmax attention.
        keypoint_counts: ``[B, h, w]`` SIFT keypoints per patch.
        grid: ``(h, w)``.
        num_prefix: prefix tokens P.
        lam: detection-line height.
        rule: ``"max"`` or ``"uniform"``.

    Returns:
        ``{"KK", "KN", "NK", "NN"}``, each ``[B, H]`` float64; KK/KN are NaN for an image without keypoint
        patches, NK/NN for one without non-keypoint patches.
    """
    p = patch_interrelation(pattern, keypoint_counts, grid, num_prefix, lam, rule)
    key = (keypoint_counts.reshape(p.shape[0], 1, -1) > 0).to(p.device)
    kk = _masked_nanmean(p, key)
    nk = _masked_nanmean(p, ~key)
    return {"KK": kk, "KN": 1 - kk, "NK": nk, "NN": 1 - nk}


def interrelation_patch_scores(
    pattern: torch.Tensor, keypoint_counts: torch.Tensor, grid: Sequence[int], num_prefix: int,
    lam: float = 0.5, rule: str = "max",
) -> torch.Tensor:
    """Per-patch score for spurious-correlation masking (paper 003 section 5.1): ``P_i`` averaged over heads.

    Returns:
        ``[B, h, w]`` float64 (heads with an empty attended set are skipped; 0 if every head's is empty).
    """
    h, w = _check(pattern, keypoint_counts, grid, num_prefix, lam, rule)
    p = patch_interrelation(pattern, keypoint_counts, grid, num_prefix, lam, rule)
    score = p.nanmean(dim=1).nan_to_num(0.0)
    return score.reshape(p.shape[0], h, w)


def interrelation_stages(kk: torch.Tensor, rise: float = 0.5) -> dict[str, list[int]]:
    """Split blocks into the retrieval, capture and coach stages of paper 003 section 4.3 from the KK curve.

    vitscope's rule (the paper names the stages but gives no rule): let ``p`` be the block where ``KK``
    (mean over heads) peaks and ``lo`` its minimum over blocks ``0..p``. Capture starts at the first block
    ``s <= p`` whose ``KK - lo`` reaches ``rise`` of ``KK[p] - lo`` and ends at ``p``; retrieval is the blocks
    before ``s``; coach the blocks after ``p`` (where KK falls back). Ties go to the first peak.

    Args:
        kk: ``[L]`` KK per block (NaN blocks are treated as the lowest value).
        rise: fraction of the rise from the minimum to the peak that opens the capture stage.

    Returns:
        ``{"retrieval": [...], "capture": [...], "coach": [...]}`` block positions (0-based, into ``kk``).
    """
    if kk.dim() != 1 or kk.numel() == 0:
        raise VitscopeValueError(f"kk must be a non-empty [L] curve, got {tuple(kk.shape)}")
    if not 0 <= rise <= 1:
        raise VitscopeValueError(f"rise must be in [0, 1], got {rise}")
    x = kk.to(torch.float64)
    x = torch.where(x.isnan(), torch.full_like(x, float("-inf")), x)
    if bool(torch.isinf(x).all()):
        return {"retrieval": [], "capture": list(range(len(x))), "coach": []}
    peak = int(torch.argmax(x))
    head = x[: peak + 1]
    lo = float(head[torch.isfinite(head)].min())
    level = lo + rise * (float(x[peak]) - lo)
    start = next(i for i in range(peak + 1) if float(head[i]) >= level)
    return {"retrieval": list(range(start)), "capture": list(range(start, peak + 1)),
            "coach": list(range(peak + 1, len(x)))}
