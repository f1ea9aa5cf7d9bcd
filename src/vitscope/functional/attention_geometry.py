"""Where heads look relative to their query (paper 002 section 4.1, appendix C; docs/methods.md, Attention):
mean attention distance, aligned aggregated attention maps (AAAM), their offset and the local-head types.

Pure tensor functions; the pattern conventions of :mod:`vitscope.functional.attention` hold here too.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vitscope.errors import VitscopeValueError
from vitscope.functional.attention import spatial_attention
from vitscope.functional.attention_patterns import as_float, check_grid, check_pattern, renormalise

__all__ = ["HEAD_TYPES", "aligned_attention", "aligned_offset", "attention_distance", "local_head_type"]

#: Labels returned by :func:`local_head_type`, in the order they are tested.
HEAD_TYPES: tuple[str, ...] = ("strict_local", "offset_local", "soft_local", "axial", "global")


def _grid_positions(h: int, w: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``[K, 2]`` positions ``(x, y) = (c / (w - 1), r / (h - 1))``, row-major; an axis of length 1 is 0."""
    ys = torch.arange(h, dtype=dtype, device=device) / (h - 1) if h > 1 else torch.zeros(1, dtype=dtype, device=device)
    xs = torch.arange(w, dtype=dtype, device=device) / (w - 1) if w > 1 else torch.zeros(1, dtype=dtype, device=device)
    yy, xx = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack([xx.reshape(-1), yy.reshape(-1)], dim=-1)


def _canvas_index(h: int, w: int, device: torch.device) -> torch.Tensor:
    """``[K, K]`` flat canvas index of key k for query q: ``(h-1 + r_k - r_q) * (2w-1) + (w-1 + c_k - c_q)``."""
    r = torch.arange(h, device=device).repeat_interleave(w)
    c = torch.arange(w, device=device).repeat(h)
    rows = h - 1 + r[None, :] - r[:, None]
    cols = w - 1 + c[None, :] - c[:, None]
    return rows * (2 * w - 1) + cols


def _odd_canvas(aaam: torch.Tensor) -> tuple[int, int]:
    if not isinstance(aaam, torch.Tensor) or aaam.dim() < 2:
        raise VitscopeValueError("aaam must be a tensor [..., 2h-1, 2w-1]")
    sh, sw = aaam.shape[-2], aaam.shape[-1]
    if sh % 2 == 0 or sw % 2 == 0:
        raise VitscopeValueError(f"an aligned map is (2h-1) x (2w-1), so both sides are odd; got {sh}x{sw}")
    return sh, sw


def attention_distance(pattern: torch.Tensor, grid: Sequence[int], num_prefix: int) -> torch.Tensor:
    """Average attention distance per image and head (Raghu et al.; paper 002 section 4.3).

    Spatial token ``(r, c)`` sits at ``(c / (w-1), r / (h-1))`` in the unit square (an axis of length 1 has
    coordinate 0); ``d = mean_q sum_k a_qk ||p_q - p_k||_2`` over the spatial attention (prefix dropped, rows
    renormalised; a row with no spatial mass contributes 0 but still counts in the mean).

    Args:
        pattern: ``[B, H, N, N]`` post-softmax attention.
        grid: ``(h, w)``, ``h * w = N - num_prefix``.
        num_prefix: number of prefix tokens.

    Returns:
        ``[B, H]`` distances in unit-square units.
    """
    check_pattern(pattern, num_prefix, grid)
    h, w = check_grid(grid)
    s = spatial_attention(pattern, num_prefix)
    pos = _grid_positions(h, w, s.dtype, s.device)
    dist = (pos[:, None, :] - pos[None, :, :]).pow(2).sum(-1).sqrt()  # [K, K]
    return (s * dist).sum(dim=-1).mean(dim=-1)


def aligned_attention(pattern: torch.Tensor, grid: Sequence[int], num_prefix: int) -> torch.Tensor:
    """Aligned aggregated attention map (AAAM) of one batch: per image and head, mean over spatial queries.

    Each spatial query ``(i, j)`` adds its ``h x w`` spatial-attention map into a zero ``(2h-1) x (2w-1)``
    canvas so that the query's own cell lands at the centre ``(h-1, w-1)``: key ``(r, c)`` goes to
    ``(h-1 + r-i, w-1 + c-j)``. The canvas is divided by ``K`` (every query counts, also one whose
    spatial row is 0). The dataset AAAM is the mean of these over images. Vectorised with one
    ``scatter_add`` (no loop over queries).

    Args:
        pattern: ``[B, H, N, N]`` post-softmax attention.
        grid: ``(h, w)``, ``h * w = N - num_prefix``.
        num_prefix: number of prefix tokens.

    Returns:
        ``[B, H, 2h-1, 2w-1]``; sums to the fraction of queries with spatial mass (1 normally).
    """
    k = check_pattern(pattern, num_prefix, grid)
    h, w = check_grid(grid)
    s = spatial_attention(pattern, num_prefix)
    lead = s.shape[:-2]
    flat = s.reshape(-1, k * k)
    index = _canvas_index(h, w, s.device).reshape(1, k * k).expand(flat.shape[0], k * k)
    canvas = torch.zeros(flat.shape[0], (2 * h - 1) * (2 * w - 1), dtype=s.dtype, device=s.device)
    canvas.scatter_add_(1, index, flat)
    return (canvas / k).reshape(*lead, 2 * h - 1, 2 * w - 1)


def aligned_offset(aaam: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Centre of mass of an aligned map (the 002 code's ``average_att_offset``).

    The map is normalised to sum 1 (a zero map stays 0, giving offset 0). Cell ``(i, j)`` of a
    ``(2h-1) x (2w-1)`` canvas has coordinates ``v_row = 2 i / (2h-2) - 1`` and ``v_col = 2 j / (2w-2) - 1``
    (in ``[-1, 1]``, centre = 0; an axis of length 1 has coordinate 0). Rows grow downwards.

    Args:
        aaam: ``[..., 2h-1, 2w-1]`` aligned map (usually the dataset AAAM ``[H, 2h-1, 2w-1]``).

    Returns:
        ``(vector, norm)``: ``vector [..., 2]`` is ``(dy, dx)`` in row/column order (the 002 code's
        ``(cy, cx)``; positive dy = below, positive dx = right), ``norm [...]`` its Euclidean length
        (the code's ``d``).
    """
    sh, sw = _odd_canvas(aaam)
    m = renormalise(as_float(aaam), dims=(-2, -1))
    vy = 2 * torch.arange(sh, dtype=m.dtype, device=m.device) / (sh - 1) - 1 if sh > 1 else m.new_zeros(1)
    vx = 2 * torch.arange(sw, dtype=m.dtype, device=m.device) / (sw - 1) - 1 if sw > 1 else m.new_zeros(1)
    dy = (m.sum(dim=-1) * vy).sum(dim=-1)
    dx = (m.sum(dim=-2) * vx).sum(dim=-1)
    vector = torch.stack([dy, dx], dim=-1)
    return vector, vector.norm(dim=-1)


def local_head_type(
    aaam: torch.Tensor,
    strict: float = 0.5,
    offset: float = 0.3,
    soft: float = 0.5,
    axial: float = 0.7,
    radius: int = 2,
) -> tuple[str, tuple[int, int]] | tuple[list, torch.Tensor]:
    """Local-head taxonomy on an (dataset) aligned map; docs/methods.md, Attention, first match wins.

    The map is normalised to sum 1, centre cell ``c = (h-1, w-1)``, peak = the largest cell (ties: the
    centre if it is among them, else the first in row-major order). In order:

    1. ``"strict_local"``: centre cell mass ``>= strict``;
    2. ``"offset_local"``: the peak is not the centre, lies within Chebyshev distance ``radius`` of it,
       and holds ``>= offset`` of the mass;
    3. ``"soft_local"``: mass within Chebyshev distance ``radius`` of the centre ``>= soft``;
    4. ``"axial"``: mass on the centre row ``>= axial``, or on the centre column ``>= axial``;
    5. ``"global"`` otherwise (also an all-zero map).

    Args:
        aaam: ``[2h-1, 2w-1]`` or batched ``[..., 2h-1, 2w-1]`` (e.g. ``[H, ...]`` or ``[L, H, ...]``).
        strict, offset, soft, axial: mass thresholds as above.
        radius: Chebyshev radius in cells for offset and soft heads.

    Returns:
        For a 2-d map: ``(label, (dy, dx))`` with Python ints. Batched: ``(labels, peaks)`` where
        ``labels`` is a list (nested lists for several leading dims) of labels and ``peaks`` a
        ``[..., 2]`` int64 tensor. ``(dy, dx)`` is the peak offset from the centre in cells (positive =
        down / right); it is reported for every head and is the head's offset for ``"offset_local"`` ones.
    """
    sh, sw = _odd_canvas(aaam)
    ch, cw = (sh - 1) // 2, (sw - 1) // 2
    m = renormalise(aaam.to(torch.float64), dims=(-2, -1))
    lead = m.shape[:-2]
    flat = m.reshape(-1, sh * sw)
    centre = flat[:, ch * sw + cw]
    peak_mass = flat.amax(dim=-1)
    first_max = flat.argmax(dim=-1)  # first maximal cell in row-major order
    peak = torch.where(centre >= peak_mass, torch.full_like(first_max, ch * sw + cw), first_max)
    dy, dx = peak // sw - ch, peak % sw - cw
    grid = m.reshape(-1, sh, sw)
    rows = torch.arange(sh, device=m.device)[:, None]
    cols = torch.arange(sw, device=m.device)[None, :]
    window = ((rows - ch).abs() <= radius) & ((cols - cw).abs() <= radius)
    window_mass = (grid * window).sum(dim=(-2, -1))
    row_mass, col_mass = grid[:, ch, :].sum(-1), grid[:, :, cw].sum(-1)
    labels = []
    for i in range(flat.shape[0]):
        is_peak_off = bool((dy[i] != 0) | (dx[i] != 0))
        if centre[i] >= strict:
            labels.append(HEAD_TYPES[0])
        elif is_peak_off and max(abs(int(dy[i])), abs(int(dx[i]))) <= radius and peak_mass[i] >= offset:
            labels.append(HEAD_TYPES[1])
        elif window_mass[i] >= soft:
            labels.append(HEAD_TYPES[2])
        elif row_mass[i] >= axial or col_mass[i] >= axial:
            labels.append(HEAD_TYPES[3])
        else:
            labels.append(HEAD_TYPES[4])
    peaks = torch.stack([dy, dx], dim=-1)
    if len(lead) == 0:
        return labels[0], (int(dy[0]), int(dx[0]))
    nested: list = labels
    for size in reversed(lead[1:]):
        nested = [nested[j : j + size] for j in range(0, len(nested), size)]
    return nested, peaks.reshape(*lead, 2)
