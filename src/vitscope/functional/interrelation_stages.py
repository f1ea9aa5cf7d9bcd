"""The retrieval, capture and coach stages of paper 003 section 4.3, read from the KK curve where it departs
from random attention (docs/methods.md, SIFT patch interrelation).

Pure tensor functions: no I/O, no plotting, no global state.
"""

from __future__ import annotations

import torch

from vitscope.errors import VitscopeValueError

__all__ = ["BAND", "STAGES", "interrelation_stages", "outside_baseline"]

STAGES: tuple[str, ...] = ("retrieval", "capture", "coach")

#: default half-width of the random baseline's band, in standard deviations over images: a medium effect
#: (Cohen's 0.5). Random-weight ViTs stay within 0.28 of them at every block, the zoo's trained ViTs but one leave
#: by 0.64-0.97 at their peak (docs/methods.md, SIFT patch interrelation); 1 std held every model in.
BAND = 0.5


def outside_baseline(curve: torch.Tensor, baseline: torch.Tensor | float, spread: torch.Tensor | float,
                     band: float = BAND) -> torch.Tensor:
    """Which blocks of ``curve`` lie outside the baseline's band ``baseline +- band * spread``.

    Args:
        curve: ``[L]`` a model's value per block (KK, mean over heads).
        baseline: ``[L]`` (or one number) the random baseline's mean per block.
        spread: ``[L]`` (or one number) its standard deviation over images.
        band: half-width of the band in standard deviations.

    Returns:
        ``[L]`` bool: ``|curve - baseline| > band * spread``. A NaN anywhere (a block without a value, a baseline
        of fewer than two images) is not outside: the data do not show a departure there.
    """
    if not band >= 0:
        raise VitscopeValueError(f"band must be a non-negative number of standard deviations, got {band}")
    x = curve.to(torch.float64)
    base = torch.as_tensor(baseline, dtype=torch.float64).expand_as(x)
    width = band * torch.as_tensor(spread, dtype=torch.float64).expand_as(x)
    out = (x - base).abs() > width
    return out & ~(x.isnan() | base.isnan() | width.isnan())


def interrelation_stages(kk: torch.Tensor, rise: float = 0.5, baseline: torch.Tensor | float | None = None,
                         spread: torch.Tensor | float | None = None, band: float = BAND) -> dict[str, list[int]]:
    """Split blocks into the retrieval, capture and coach stages of paper 003 section 4.3 from the KK curve.

    vitscope's rule (the paper names the stages but gives no rule): let ``p`` be the block where ``KK``
    (mean over heads) peaks and ``lo`` its minimum over blocks ``0..p``. Capture starts at the first block
    ``s <= p`` whose ``KK - lo`` reaches ``rise`` of ``KK[p] - lo`` and ends at ``p``; retrieval is the blocks
    before ``s``; coach the blocks after ``p`` (where KK falls back). Ties go to the first peak.

    With a random ``baseline`` the stages are read only where the data support them: when no block lies
    outside the baseline's band (:func:`outside_baseline`) the curve is within the spread of random attention
    and every stage is empty ("no stage structure").

    Args:
        kk: ``[L]`` KK per block (NaN blocks are treated as the lowest value).
        rise: fraction of the rise from the minimum to the peak that opens the capture stage.
        baseline: ``[L]`` (or one number) the random baseline's KK per block; None: no comparison.
        spread: the baseline's standard deviation over images (required with ``baseline``).
        band: half-width of the band in standard deviations.

    Returns:
        ``{"retrieval": [...], "capture": [...], "coach": [...]}`` block positions (0-based, into ``kk``).
    """
    if kk.dim() != 1 or kk.numel() == 0:
        raise VitscopeValueError(f"kk must be a non-empty [L] curve, got {tuple(kk.shape)}")
    if not 0 <= rise <= 1:
        raise VitscopeValueError(f"rise must be in [0, 1], got {rise}")
    if baseline is not None:
        if spread is None:
            raise VitscopeValueError("a baseline needs its spread (the standard deviation over images)")
        if not bool(outside_baseline(kk, baseline, spread, band).any()):
            return {stage: [] for stage in STAGES}
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
