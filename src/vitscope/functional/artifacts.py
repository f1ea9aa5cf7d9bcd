"""Maths of the artifact diagnostics (docs/methods.md, "Artifacts"): token-norm bins, the threshold that splits a
bimodal norm histogram, massive activations, per-patch pixel variance.

Token norms are binned on a fixed logarithmic scale so that histograms, and every quantity summed per bin (attention
received, MLP activations, object overlap), merge exactly over batches and processes; a threshold chosen after the
pass at a bin edge then selects exactly the tokens above it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vitscope.errors import VitscopeValueError

__all__ = ["NormBins", "massive_activations", "patch_variance", "split_threshold"]


@dataclass(frozen=True)
class NormBins:
    """Logarithmic bins of token norms: bin ``b`` holds norms in ``[10^(low + b w), 10^(low + (b + 1) w))``; norms
    below the first edge fall in bin 0, above the last in the last bin.

    Args:
        low: log10 of the first edge; width: bin width in log10; count: number of bins.
    """

    low: float = -2.0
    width: float = 0.1
    count: int = 70

    @classmethod
    def through(cls, threshold: float, width: float = 0.1, low: float = -2.0, high: float = 5.0) -> NormBins:
        """Bins spanning about ``[10^low, 10^high]`` with ``threshold`` exactly on an edge (a threshold set by hand
        then selects exactly the tokens above it)."""
        if not 10.0**low < threshold < 10.0**high:
            raise VitscopeValueError(f"a norm threshold must lie between {10.0**low:g} and {10.0**high:g}, got "
                                     f"{threshold}")
        t = math.log10(threshold)
        first = t - math.ceil((t - low) / width) * width
        return cls(low=first, width=width, count=int(math.ceil((high - first) / width)))

    def edges(self) -> torch.Tensor:
        """``[count + 1]`` float64 norms at the bin edges."""
        return torch.pow(10.0, self.low + self.width * torch.arange(self.count + 1, dtype=torch.float64))

    def of(self, norms: torch.Tensor) -> torch.Tensor:
        """Bin of every norm: ``[...]`` -> ``[...]`` int64 in ``[0, count)``."""
        logs = torch.log10(norms.double().clamp_min(1e-30))
        return ((logs - self.low) / self.width).floor().clamp(0, self.count - 1).long()


def split_threshold(counts: torch.Tensor, max_share: float = 0.1, min_ratio: float = 4.0) -> int | None:
    """The bin edge that splits a bimodal histogram of token norms into the bulk and a few high-norm outliers, or None
    when it holds no such outliers.

    Otsu's split of the log-norm histogram (the edge that maximises the between-class variance); where several edges
    tie (the empty bins of a gap) the middle one. The split counts only when the upper class is a minority (at most
    ``max_share`` of the tokens: Darcet et al. 2024 find about 2 %) and its mean norm is at least ``min_ratio`` times
    the lower class's (geometric means). A split whose upper class holds more than ``max_share`` (a broad bulk is
    split near its middle before a small mode above it) is searched again within its upper class, until the upper
    class is small enough; a unimodal histogram then fails the ratio between the two classes of the last split.

    Args:
        counts: ``[NB]`` token counts per bin.
        max_share: largest share of tokens the outliers may hold.
        min_ratio: least ratio of the classes' geometric mean norms.

    Returns:
        The edge ``e`` (tokens in bins ``>= e`` are outliers), or None.
    """
    c = counts.double().cpu()
    total = float(c.sum())
    start = 0
    while total > 0:
        found = _otsu(c[start:])
        if found is None:
            return None
        edge, upper, gap = start + found[0], found[1], found[2]
        if upper <= max_share * total:
            return edge if gap >= 0 and _enough(gap, min_ratio) else None
        start = edge  # the outliers, if any, are a mode within the upper class
    return None


def _otsu(c: torch.Tensor) -> tuple[int, float, float] | None:
    """Otsu's split of one histogram ``[NB]``: ``(edge, tokens above it, gap between the classes' means in bins)``,
    None when no edge has tokens on both sides."""
    total = float(c.sum())
    centre = torch.arange(c.numel(), dtype=torch.float64) + 0.5  # in bin widths
    below_n = torch.cumsum(c, 0)[:-1]  # tokens below edge e = 1..NB-1
    below_s = torch.cumsum(c * centre, 0)[:-1]
    above_n, above_s = total - below_n, float((c * centre).sum()) - below_s
    ok = (below_n > 0) & (above_n > 0)
    if not bool(ok.any()):
        return None
    spread = (above_s / above_n.clamp_min(1) - below_s / below_n.clamp_min(1)) ** 2
    between = torch.where(ok, below_n * above_n * spread, torch.full_like(below_n, -1.0))
    best = float(between.max())
    tied = torch.nonzero(between >= best * (1 - 1e-12)).flatten()
    edge = int(tied[len(tied) // 2]) + 1
    upper = float(above_n[edge - 1])
    gap = float(above_s[edge - 1] / upper - below_s[edge - 1] / below_n[edge - 1])
    return edge, upper, gap


def _enough(gap_bins: float, min_ratio: float, width: float = 0.1) -> bool:
    """Whether a gap of ``gap_bins`` bins of ``width`` (log10) is a ratio of at least ``min_ratio``."""
    return gap_bins * width >= math.log10(min_ratio)


def massive_activations(hidden: torch.Tensor, absolute: float = 100.0, relative: float = 1000.0
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Massive activations of one hidden state (Sun et al. 2024): entries whose magnitude exceeds ``absolute`` and
    ``relative`` times the median magnitude of the image's hidden state (every token and dimension).

    Args:
        hidden: ``[B, T, D]`` a block's output.
        absolute, relative: the two thresholds (Sun et al.: 100 and about 1,000).

    Returns:
        ``(flagged [B, T, D] bool, ratio [B, T, D] float32 magnitude / median, median [B])``.
    """
    if hidden.dim() != 3:
        raise VitscopeValueError(f"hidden must be [B, T, D], got {tuple(hidden.shape)}")
    magnitude = hidden.detach().float().abs()
    median = magnitude.flatten(1).median(dim=1).values  # torch's lower median, as Sun et al.'s code
    ratio = magnitude / median.clamp_min(torch.finfo(torch.float32).tiny)[:, None, None]
    return (magnitude > absolute) & (ratio > relative), ratio, median


def patch_variance(pixels: torch.Tensor, patch: int) -> torch.Tensor:
    """Variance of the pixel values (every channel) inside each patch: low values mark flat, low-information patches.

    Args:
        pixels: ``[B, C, H, W]`` model inputs; patch: the patch side (H and W multiples of it).

    Returns:
        ``[B, K]`` with K = (H / patch) * (W / patch), row-major.
    """
    b, c, h, w = pixels.shape
    if h % patch or w % patch:
        raise VitscopeValueError(f"pixels of {h} x {w} do not split into patches of {patch}")
    tiles = pixels.float().reshape(b, c, h // patch, patch, w // patch, patch).permute(0, 2, 4, 1, 3, 5)
    return tiles.reshape(b, (h // patch) * (w // patch), -1).var(dim=-1, unbiased=False)
