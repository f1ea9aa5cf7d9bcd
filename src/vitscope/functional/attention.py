"""Attention-pattern maths of docs/methods.md, Attention (paper 002 section 4, paper 003 section 4.2).

Pure tensor functions: no I/O, no plotting, no global state. Conventions (docs/methods.md, Shared rules):

- A pattern is post-softmax attention ``[B, H, N, N]`` (any leading dims ``[..., N, N]`` work), the row
  is the query, the column the key. Tokens are ``P = num_prefix`` prefix tokens (CLS, distillation,
  registers; ``P = 0`` for SigLIP-like models) followed by the ``K = h * w`` spatial tokens row-major:
  spatial token ``(r, c)`` has index ``P + r * w + c``. Grids need not be square.
- A row or map that sums to 0 stays 0 after "renormalise".
- Computation dtype: float64 input stays float64, anything else (half, bfloat16, float32, integers) is
  computed and returned in float32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from vitscope.functional.attention_kernels import mean_spatial_focus
from vitscope.functional.attention_stats import attention_entropy

__all__ = [
    "HEAD_TYPES",
    "aligned_attention",
    "aligned_offset",
    "attention_distance",
    "attention_entropy",
    "cls_attention_map",
    "focus_index",
    "local_head_type",
    "mass_mask",
    "random_attention",
    "spatial_attention",
    "spatial_average_map",
]

#: Labels returned by :func:`local_head_type`, in the order they are tested.
HEAD_TYPES: tuple[str, ...] = ("strict_local", "offset_local", "soft_local", "axial", "global")


# ---------------------------------------------------------------- helpers


def _as_float(x: torch.Tensor) -> torch.Tensor:
    """float64 stays float64, everything else becomes float32."""
    return x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)


def _renormalise(x: torch.Tensor, dims: int | tuple[int, ...] = -1) -> torch.Tensor:
    """Divide by the sum over ``dims``; a slice summing to 0 stays 0."""
    s = x.sum(dim=dims, keepdim=True)
    return x / torch.where(s == 0, torch.ones_like(s), s)


def _check_grid(grid: Sequence[int]) -> tuple[int, int]:
    try:
        h, w = (int(v) for v in grid)
    except (TypeError, ValueError):
        raise ValueError(f"grid must be a pair (h, w) of positive ints, got {grid!r}") from None
    if h < 1 or w < 1:
        raise ValueError(f"grid must be a pair (h, w) of positive ints, got {grid!r}")
    return h, w


def _check_pattern(pattern: torch.Tensor, num_prefix: int, grid: Sequence[int] | None = None) -> int:
    """Validate ``[..., N, N]`` and the prefix/grid split; return K = N - num_prefix."""
    if not isinstance(pattern, torch.Tensor):
        raise TypeError(f"pattern must be a torch.Tensor, got {type(pattern).__name__}")
    if pattern.dim() < 2 or pattern.shape[-1] != pattern.shape[-2]:
        raise ValueError(
            f"pattern must be an attention pattern [B, H, N, N] (queries x keys), got shape {tuple(pattern.shape)}"
        )
    n = pattern.shape[-1]
    if not 0 <= int(num_prefix) < n:
        raise ValueError(f"num_prefix must be in [0, N) with N = {n} tokens, got {num_prefix}")
    k = n - int(num_prefix)
    if grid is not None:
        h, w = _check_grid(grid)
        if h * w != k:
            raise ValueError(
                f"grid {h}x{w} has {h * w} spatial tokens but the pattern has N - num_prefix = {n} - {num_prefix}"
                f" = {k}; pass the model's grid and its number of prefix tokens (CLS, distillation, registers)"
            )
    return k


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
        raise ValueError("aaam must be a tensor [..., 2h-1, 2w-1]")
    sh, sw = aaam.shape[-2], aaam.shape[-1]
    if sh % 2 == 0 or sw % 2 == 0:
        raise ValueError(f"an aligned map is (2h-1) x (2w-1), so both sides are odd; got {sh}x{sw}")
    return sh, sw


# ---------------------------------------------------------------- maps


def spatial_attention(pattern: torch.Tensor, num_prefix: int) -> torch.Tensor:
    """Spatial attention: drop prefix rows and columns, renormalise every row to sum 1.

    A row whose spatial keys sum to 0 (all its mass on prefix tokens) stays 0.

    Args:
        pattern: ``[B, H, N, N]`` post-softmax attention.
        num_prefix: number of prefix tokens P (0 for models without CLS).

    Returns:
        ``[B, H, K, K]`` with ``K = N - P``.
    """
    _check_pattern(pattern, num_prefix)
    p = int(num_prefix)
    return _renormalise(_as_float(pattern)[..., p:, p:])


def cls_attention_map(
    pattern: torch.Tensor, grid: Sequence[int], num_prefix: int, renormalise: bool = False
) -> torch.Tensor:
    """Attention of the CLS token (row 0) over the spatial keys, as a map.

    Args:
        pattern: ``[B, H, N, N]`` post-softmax attention.
        grid: ``(h, w)`` spatial grid, ``h * w = N - num_prefix``.
        num_prefix: number of prefix tokens; must be >= 1 (token 0 is the CLS token).
        renormalise: divide the map by its sum (a map summing to 0 stays 0). Default: raw weights.

    Returns:
        ``[B, H, h, w]``.
    """
    if int(num_prefix) < 1:
        raise ValueError("cls_attention_map needs a CLS token (num_prefix >= 1); this model has no prefix tokens")
    _check_pattern(pattern, num_prefix, grid)
    h, w = _check_grid(grid)
    m = _as_float(pattern)[..., 0, int(num_prefix) :]
    if renormalise:
        m = _renormalise(m)
    return m.reshape(*m.shape[:-1], h, w)


def spatial_average_map(pattern: torch.Tensor, grid: Sequence[int], num_prefix: int) -> torch.Tensor:
    """Spatial-average map: the raw rows of the spatial queries over the spatial keys, summed, then normalised.

    Rows are NOT renormalised first, so a query that puts mass on prefix tokens weighs less. The map is
    divided by its sum (a map summing to 0 stays 0).

    Args:
        pattern: ``[B, H, N, N]`` post-softmax attention.
        grid: ``(h, w)``, ``h * w = N - num_prefix``.
        num_prefix: number of prefix tokens.

    Returns:
        ``[B, H, h, w]`` summing to 1 over ``(h, w)``.
    """
    _check_pattern(pattern, num_prefix, grid)
    h, w = _check_grid(grid)
    p = int(num_prefix)
    m = _renormalise(_as_float(pattern)[..., p:, p:].sum(dim=-2))
    return m.reshape(*m.shape[:-1], h, w)


def mass_mask(attention_map: torch.Tensor, mass: float = 0.6) -> torch.Tensor:
    """Smallest set of highest tokens holding ``mass`` of an attention map (DINO's thresholding).

    The map is renormalised over its last two dims (in float64). Tokens are ranked by decreasing value,
    ties broken by lower row-major index first (stable sort); a token is kept when the mass of the tokens
    ranked before it is still below ``mass``. This is DINO's rule (sort ascending, keep tokens whose
    cumulative sum exceeds ``1 - mass``) with a deterministic tie order. An all-zero map gives all False.

    Args:
        attention_map: ``[..., h, w]`` non-negative map (CLS map or spatial-average map).
        mass: fraction of the mass to keep, in ``(0, 1]``.

    Returns:
        ``[..., h, w]`` bool mask.
    """
    if not isinstance(attention_map, torch.Tensor) or attention_map.dim() < 2:
        raise ValueError("attention_map must be a tensor [..., h, w]")
    if not 0.0 < float(mass) <= 1.0:
        raise ValueError(f"mass must be in (0, 1], got {mass}")
    shape = attention_map.shape
    flat = attention_map.to(torch.float64).reshape(*shape[:-2], -1)
    flat = _renormalise(flat)
    values, order = torch.sort(flat, dim=-1, descending=True, stable=True)
    before = torch.cumsum(values, dim=-1) - values  # mass ranked strictly before each token
    keep_sorted = (before < float(mass)) & (values > 0)
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return keep.reshape(shape)


# ---------------------------------------------------------------- distance and aligned maps


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
    _check_pattern(pattern, num_prefix, grid)
    h, w = _check_grid(grid)
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
    k = _check_pattern(pattern, num_prefix, grid)
    h, w = _check_grid(grid)
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
    m = _renormalise(_as_float(aaam), dims=(-2, -1))
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
    m = _renormalise(aaam.to(torch.float64), dims=(-2, -1))
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


# ---------------------------------------------------------------- focus and random baseline


def focus_index(pattern: torch.Tensor, grid: Sequence[int], num_prefix: int, normalised: bool = False) -> torch.Tensor:
    """Attention focus index (paper 003 eq. 5 as reconstructed in docs/methods.md). Lower = more focused.

    For each spatial query row of the spatial attention: min-max normalise to ``[0, 1]`` (a row whose
    renormalised ``max - min < 1e-12``, including an all-zero row, counts as uniform), divide by its sum, Shannon
    entropy in nats (``0 log 0 = 0``); mean over the spatial queries. After min-max the row's minimum is
    exactly 0, so a one-hot row gives 0 and a uniform row gives ``log K``.

    Args:
        pattern: ``[B, H, N, N]`` post-softmax attention.
        grid: ``(h, w)``, ``h * w = N - num_prefix``.
        num_prefix: number of prefix tokens.
        normalised: divide by ``log K`` (values in ``[0, 1]``; with ``K = 1`` the result is 0).

    Returns:
        ``[B, H]``.
    """
    k = _check_pattern(pattern, num_prefix, grid)
    sp = _as_float(pattern)[..., num_prefix:, num_prefix:]
    entropy = mean_spatial_focus(sp, sp.sum(dim=-1))  # the shared attention pass's code
    if normalised:
        entropy = entropy / math.log(k) if k > 1 else torch.zeros_like(entropy)
    return entropy


def random_attention(
    shape: Sequence[int],
    generator: torch.Generator,
    kind: str = "uniform",
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Random-baseline attention pattern, as the 002 code's random wrapper.

    ``kind="uniform"``: ``r ~ U(0, 1)`` of ``shape``, divided by its mean over queries, i.e.
    ``r / r.mean(dim=-2, keepdim=True)`` (the code's ``torch.mean(r, dim=3)`` on ``[L, B, H, N, N]``), so
    every key column has mean 1 over the queries; rows do NOT sum to 1 (the analyses renormalise
    spatial rows). ``kind="gaussian"``: the same with ``|N(0, 1)|`` (half-normal) values, which keeps the
    pattern non-negative. Draws on ``generator.device`` so the same seed gives the same numbers.

    Args:
        shape: ``[B, H, N, N]`` (any ``[..., N, N]``).
        generator: seeded ``torch.Generator``.
        kind: ``"uniform"`` or ``"gaussian"``.
        dtype: ``torch.float32`` (default) or ``torch.float64``.

    Returns:
        Tensor of ``shape`` on the generator's device.
    """
    shape = tuple(int(v) for v in shape)
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise ValueError(f"shape must be [B, H, N, N], got {shape}")
    if not isinstance(generator, torch.Generator):
        raise TypeError("generator must be a torch.Generator (seeded with generator.manual_seed(seed))")
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    if kind == "uniform":
        r = torch.rand(shape, generator=generator, dtype=dtype, device=generator.device)
    elif kind == "gaussian":
        r = torch.randn(shape, generator=generator, dtype=dtype, device=generator.device).abs()
    else:
        raise ValueError(f"kind must be 'uniform' or 'gaussian', got {kind!r}")
    return r / r.mean(dim=-2, keepdim=True)
