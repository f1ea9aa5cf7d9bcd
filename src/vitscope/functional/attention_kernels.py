"""The two row statistics that the functional definitions and the shared attention pass both compute.

One formulation each, so :func:`~vitscope.functional.attention_entropy`, :func:`~vitscope.functional.focus_index`
and :func:`~vitscope.functional.attention_blocks.block_statistics` cannot drift apart. Both are written for
speed on large patterns: clamp to the smallest normal number, ``log``, multiply, ``sum`` (so ``0 log 0`` is 0
and a NaN in the pattern stays NaN) instead of ``xlogy``, which is a scalar loop three times slower here (a
``nansum`` form is 15 % faster but turns NaN inputs into finite numbers); both can write into
caller-owned work buffers.
"""

from __future__ import annotations

import math

import torch

__all__ = ["FLAT", "mean_row_entropy", "mean_spatial_focus"]

FLAT = 1e-12  # a spatial row whose renormalised max - min is below this is uniform (docs/methods.md, focus)


def mean_row_entropy(a: torch.Tensor, work: torch.Tensor | None = None) -> torch.Tensor:
    """Shannon entropy in nats of every row ``a[..., q, :]`` (used as given, ``0 log 0 = 0``), mean over rows.

    Negative entries (numerical noise) count as about 0 (their log is taken at the smallest normal number);
    NaN or infinite entries give NaN, never a finite number.

    Args:
        a: ``[..., Nq, Nk]`` non-negative rows.
        work: optional buffer of ``a``'s shape and dtype (overwritten).

    Returns:
        ``[...]`` in ``a``'s dtype.
    """
    tiny = torch.finfo(a.dtype).tiny  # 0 log 0 = 0 through a finite log; a NaN input stays NaN (nansum hid it)
    buf = torch.clamp_min(a, tiny) if work is None else torch.clamp_min(a, tiny, out=work)
    buf.log_().mul_(a)
    entropy = -buf.sum(dim=-1).mean(dim=-1)
    # an infinite weight gives -inf (inf log inf): not an entropy either, so NaN as for a NaN weight
    return entropy.masked_fill(entropy.isinf(), math.nan)


def mean_spatial_focus(sp: torch.Tensor, rowsum: torch.Tensor, work: torch.Tensor | None = None,
                       work2: torch.Tensor | None = None) -> torch.Tensor:
    """Attention focus index (paper 003 eq. 5, docs/methods.md) of spatial rows, mean over the spatial queries.

    Per row: ``log T - X / T`` with ``d = a - min``, ``T = sum d``, ``X = sum d log d``. That is the entropy of
    ``u / sum(u)`` for the min-max normalised row ``u = d / (max - min)``; it does not depend on the row's scale,
    so raw (not renormalised) rows can be used. A row is uniform (entropy ``log K``) when its renormalised span
    is below :data:`FLAT` (``span < FLAT * rowsum``) or it has no mass.

    Args:
        sp: ``[..., K, K]`` spatial attention (queries x keys), any scale.
        rowsum: ``[..., K]`` the rows' sums.
        work, work2: optional buffers of ``sp``'s shape and dtype (overwritten).

    Returns:
        ``[...]`` in ``sp``'s dtype.
    """
    k = sp.shape[-1]
    lo = sp.amin(dim=-1)  # amin and amax separately: torch.aminmax is several times slower here
    span = sp.amax(dim=-1) - lo
    d = torch.sub(sp, lo.unsqueeze(-1)) if work is None else torch.sub(sp, lo.unsqueeze(-1), out=work)
    total = d.sum(dim=-1)
    tiny = torch.finfo(d.dtype).tiny  # as in mean_row_entropy: d = 0 gives 0, a NaN input stays NaN
    dlogd = torch.clamp_min(d, tiny) if work2 is None else torch.clamp_min(d, tiny, out=work2)
    x = dlogd.log_().mul_(d).sum(dim=-1)
    flat = (span < FLAT * rowsum) | (rowsum == 0)
    safe = torch.where(flat, torch.ones_like(total), total)
    entropy = torch.where(flat, torch.full_like(total, math.log(k)), safe.log() - x / safe)
    return entropy.mean(dim=-1)
