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

A query whose attended set is empty (a spatial row with no mass) has ``P_i = NaN`` and is left out of the means;
``lam >= 1`` under ``"max"`` would empty every set, and is refused. :func:`random_interrelation` is the same on
random attention (the baseline); the stages read from the KK curve are in
:mod:`vitscope.functional.interrelation_stages`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from vitscope.errors import VitscopeValueError
from vitscope.functional.attention import random_attention, spatial_attention
from vitscope.functional.image_groups import images_per_group

__all__ = ["RULES", "check_detection", "interrelation", "interrelation_patch_scores", "patch_interrelation",
           "random_interrelation"]

RULES: tuple[str, ...] = ("max", "uniform")


def check_detection(lam: float, rule: str) -> None:
    """The attended-set rule and its threshold can select keys: a known rule, ``lam >= 0``, and ``lam < 1`` under
    ``"max"`` (no key has more than its row's maximum).

    Raises:
        ValueError: otherwise, naming the parameter.
    """
    if rule not in RULES:
        raise VitscopeValueError(f"rule must be one of {RULES}, got {rule!r}")
    if not lam >= 0:
        raise VitscopeValueError(f"lam must be a non-negative number, got {lam}")
    if rule == "max" and lam >= 1:
        raise VitscopeValueError(f"lam must be below 1 under rule 'max' (keys above lam times the row's maximum: "
                                 f"none above it), got {lam}; rule 'uniform' compares with lam / K")


def _check(pattern: torch.Tensor, counts: torch.Tensor, grid: Sequence[int], num_prefix: int,
           lam: float, rule: str) -> tuple[int, int]:
    check_detection(lam, rule)
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
    n32, weight32 = _weights(keypoint_counts.reshape(pattern.shape[0], -1).to(pattern.device))
    step = images_per_group(pattern[:1].numel() * 4)  # the attended sets of a whole batch would take GBs
    num, den = [], []
    for i in range(0, pattern.shape[0], step):
        sets = attended_sets(spatial_attention(pattern[i:i + step], num_prefix), lam, rule).float()
        num.append(torch.einsum("bhqk,bk->bhq", sets, n32[i:i + step]).double())
        den.append(torch.einsum("bhqk,bk->bhq", sets, weight32[i:i + step]).double())
    return _ratio(torch.cat(num), torch.cat(den))


def _ratio(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """``numerator / denominator``, NaN where the denominator is 0 (an empty attended set)."""
    ok = denominator > 0
    return torch.where(ok, numerator / torch.where(ok, denominator, torch.ones_like(denominator)),
                       torch.full_like(denominator, float("nan")))


def _weights(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Numerator and denominator weights ``[B, K]`` float32 of the patches: ``n_j``, and ``n_j`` or 1.

    Keypoint counts and set sizes are integers far below 2**24, so float32 sums of them are exact.
    """
    n = counts.to(torch.float32)
    return n, torch.where(n > 0, n, torch.ones_like(n))  # a non-keypoint patch weighs 1 in the denominator


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
    return _quantities(patch_interrelation(pattern, keypoint_counts, grid, num_prefix, lam, rule), keypoint_counts)


def _quantities(p: torch.Tensor, keypoint_counts: torch.Tensor) -> dict[str, torch.Tensor]:
    """KK, KN, NK, NN ``[B, H]`` from the per-query interrelation ``p`` ``[B, H, K]``."""
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


@functools.lru_cache(maxsize=2)
def _random_sets(seed: int, kind: str, samples: int, h: int, w: int, num_prefix: int, lam: float,
                 rule: str) -> torch.Tensor:
    """Attended sets ``[samples, K, K]`` float32 (CPU) of ``samples`` random heads; a pure function, cached."""
    n = num_prefix + h * w
    pattern = random_attention((1, samples, n, n), torch.Generator().manual_seed(seed), kind, torch.float64)
    return attended_sets(spatial_attention(pattern, num_prefix), lam, rule)[0].float()


def random_interrelation(
    keypoint_counts: torch.Tensor, grid: Sequence[int], num_prefix: int, lam: float = 0.5, rule: str = "max",
    seed: int = 0, samples: int = 4, kind: str = "uniform",
) -> dict[str, torch.Tensor]:
    """KK, KN, NK and NN of every image under random attention: the interrelation's random baseline.

    ``samples`` random heads (:func:`~vitscope.functional.random_attention`, rows summing to 1) are drawn
    once from ``seed`` for the token layout and shared by every image, since random attention depends on
    neither the image nor the block; each image's keypoint counts then give its values exactly as
    :func:`interrelation` gives a model's (docs/methods.md, Random baselines). Computed on the CPU.

    Args:
        keypoint_counts: ``[B, h, w]`` SIFT keypoints per patch.
        grid: ``(h, w)``.
        num_prefix: prefix tokens P.
        lam, rule: the detection line, as for :func:`interrelation`.
        seed: seed of the random heads.
        samples: number of random heads.
        kind: ``"uniform"`` or ``"gaussian"`` values (:func:`~vitscope.functional.random_attention`).

    Returns:
        ``{"KK", "KN", "NK", "NN"}``, each ``[B, samples]`` float64 (NaN as for :func:`interrelation`).
    """
    h, w = (int(v) for v in grid)
    check_detection(lam, rule)
    if int(samples) < 1:
        raise VitscopeValueError(f"samples must be at least 1, got {samples}")
    counts = keypoint_counts.detach()
    if counts.device.type != "cpu":  # counts on the host (the usual case) are used as they are
        counts = counts.cpu()
    if tuple(counts.shape[1:]) != (h, w):
        raise VitscopeValueError(f"keypoint_counts must be [B, h, w] with (h, w) = {(h, w)}, got {list(counts.shape)}")
    sets = _random_sets(int(seed), kind, int(samples), h, w, int(num_prefix), float(lam), rule)
    n32, weight32 = _weights(counts.reshape(counts.shape[0], -1))
    numerator = torch.einsum("sqk,bk->bsq", sets, n32).double()
    denominator = torch.einsum("sqk,bk->bsq", sets, weight32).double()
    return _quantities(_ratio(numerator, denominator), counts)
