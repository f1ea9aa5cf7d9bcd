"""One pass over a block's attention pattern for every per-block statistic of the attention analyses.

The attention analyses (maps, aligned maps, distance, saliency, entropy and focus, rollout) all read the
same ``[B, H, N, N]`` pattern of every block. Instead of each analysis calling the
:mod:`vitscope.functional.attention` functions on it (each makes its own renormalised copy, and the
aligned map scatters every entry of every image), :func:`block_statistics` computes the per-batch
quantities they need in one go, with per-grid index and distance tables (:func:`grid_tables`, cached)
and the caller's reusable work buffers (:class:`Workspace`) instead of fresh full-size temporaries:

=============  ============================================================================  ==============
quantity       meaning (docs/methods.md, Attention)                                                shape
=============  ============================================================================  ==============
``cls``        CLS row over the spatial keys, raw                                            ``[B, H, K]``
``colsum``     sum of the raw spatial query rows over the spatial keys (spatial-average map  ``[B, H, K]``
               before its normalisation)
``rowsum``     spatial mass of every spatial query row                                       ``[B, H, K]``
``aligned``    sum over the batch's images of the per-image aligned map (AAAM), flattened    ``[H, C]``
``entropy``    plain row entropy over all keys, mean over all queries                        ``[B, H]``
``focus``      attention focus index (paper 003), mean over spatial queries                  ``[B, H]``
``peak``       largest weight of every row over all keys, mean over all queries              ``[B, H]``
``fused_*``    heads fused by mean / max / min (rollout input)                               ``[B, N, N]``
=============  ============================================================================  ==============

with ``K = h * w`` spatial tokens and ``C = (2h - 1)(2w - 1)`` aligned-map cells. The per-image average
attention distance is the aligned map's dot product with the distance of each cell from the centre
(``GridTables.cell_distance``), because the distance of a key from its query depends only on the offset
that the aligned map indexes by; so ``aligned`` also gives the distance at no extra cost.

:func:`random_block_statistics` does the same for the random baseline (computed once per configuration,
seeded; a pure function, so its small cache holds no run state). The engine computes the statistics of every
block once per batch, with the union of what the analyses of the run need, and hands them to each analysis
with the batch (:mod:`vitscope.analyses.shared`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from vitscope.errors import VitscopeValueError
from vitscope.functional.attention import random_attention
from vitscope.functional.attention_kernels import mean_row_entropy, mean_spatial_focus
from vitscope.functional.compiled import compiled_call
from vitscope.functional.image_groups import images_per_group

__all__ = [
    "FUSIONS",
    "QUANTITIES",
    "BlockStats",
    "GridTables",
    "Workspace",
    "block_statistics",
    "grid_tables",
    "random_block_statistics",
    "random_patterns",
]

FUSIONS: tuple[str, ...] = ("mean", "max", "min")
QUANTITIES: frozenset[str] = frozenset(
    {"cls", "colsum", "rowsum", "aligned", "entropy", "focus", "peak"} | {f"fused_{m}" for m in FUSIONS}
)


# ---------------------------------------------------------------- per-grid tables


@dataclass(frozen=True)
class GridTables:
    """Index and distance tables of one ``h x w`` grid (built once per grid and device).

    Attributes:
        grid: ``(h, w)``.
        canvas_shape: ``(2h - 1, 2w - 1)``.
        canvas_index: ``[K * K]`` int64: flat aligned-map cell of (query q, key k), row-major over (q, k).
        cell_distance: ``[C]`` float64 unit-square distance between a query and a key at each cell's offset.
    """

    grid: tuple[int, int]
    canvas_shape: tuple[int, int]
    canvas_index: torch.Tensor
    cell_distance: torch.Tensor


@functools.lru_cache(maxsize=32)
def _grid_tables(h: int, w: int, device: str) -> GridTables:
    dev = torch.device(device)
    r = torch.arange(h, device=dev).repeat_interleave(w)
    c = torch.arange(w, device=dev).repeat(h)
    index = (h - 1 + r[None, :] - r[:, None]) * (2 * w - 1) + (w - 1 + c[None, :] - c[:, None])
    # the unit-square position of token (r, c) is (c / (w-1), r / (h-1)); an axis of length 1 has coordinate 0
    dy = torch.arange(-(h - 1), h, dtype=torch.float64, device=dev) / max(h - 1, 1)
    dx = torch.arange(-(w - 1), w, dtype=torch.float64, device=dev) / max(w - 1, 1)
    dist = (dy[:, None] ** 2 + dx[None, :] ** 2).sqrt().reshape(-1)
    return GridTables((h, w), (2 * h - 1, 2 * w - 1), index.reshape(-1).contiguous(), dist)


def grid_tables(grid: Sequence[int], device: torch.device | str = "cpu") -> GridTables:
    """Cached :class:`GridTables` of ``grid`` on ``device``."""
    h, w = (int(v) for v in grid)
    return _grid_tables(h, w, str(torch.device(device)))


# ---------------------------------------------------------------- work buffer


class Workspace:
    """Flat scratch tensors reused across blocks and batches, owned by the caller (the engine: one per run).

    Full-size temporaries would be page-faulted in anew for every block (the engine sends large blocks
    back to the OS, engine/memory.py), which costs more than the arithmetic; reused buffers avoid that
    (two slots: the focus index needs two at once). Freed with the workspace.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype, int], torch.Tensor] = {}

    def buffer(self, shape: Sequence[int], dtype: torch.dtype, device: torch.device, slot: int = 0) -> torch.Tensor:
        """A tensor of ``shape`` (contents undefined) backed by this workspace's buffer ``slot``."""
        numel = 1
        for size in shape:
            numel *= int(size)
        key = (str(device), dtype, slot)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < numel:
            self._buffers.pop(key, None)
            with torch.inference_mode(False):  # a normal tensor: writable both inside and outside inference mode
                buf = torch.empty(numel, dtype=dtype, device=device)
            self._buffers[key] = buf
        return buf[:numel].view(*shape)

    def release(self) -> None:
        """Free every buffer (they are re-created on demand)."""
        self._buffers.clear()


def _scratch(workspace: Workspace | None, like: torch.Tensor, dtype: torch.dtype, slot: int = 0) -> torch.Tensor | None:
    return None if workspace is None else workspace.buffer(like.shape, dtype, like.device, slot)


# ---------------------------------------------------------------- the pass


#: quantities that do not depend on the token layout (any N, any grid)
_ANY_LAYOUT = frozenset({"entropy", "peak"} | {f"fused_{m}" for m in FUSIONS})
_FIELDS = ("cls", "colsum", "rowsum", "aligned", "entropy", "focus", "peak")


@dataclass
class BlockStats:
    """Per-batch statistics of one block's pattern (see the module docstring for each quantity).

    Tensors stay on the pattern's device in its computation dtype, except ``aligned`` (float64).
    A field is None until computed.
    """

    batch_size: int
    num_heads: int
    grid: tuple[int, int]
    num_prefix: int
    cls: torch.Tensor | None = None
    colsum: torch.Tensor | None = None
    rowsum: torch.Tensor | None = None
    aligned: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    focus: torch.Tensor | None = None
    peak: torch.Tensor | None = None
    fused: dict[str, torch.Tensor] = field(default_factory=dict)

    def have(self) -> frozenset[str]:
        """Names of the quantities computed so far."""
        names = {n for n in _FIELDS if getattr(self, n) is not None}
        return frozenset(names | {f"fused_{m}" for m in self.fused})

    def update_from(self, other: BlockStats) -> None:
        for n in _FIELDS:
            if getattr(other, n) is not None:
                setattr(self, n, getattr(other, n))
        self.fused.update(other.fused)


def _check(pattern: torch.Tensor, grid: Sequence[int], num_prefix: int, needs: Iterable[str]) -> tuple[int, int, int]:
    if not isinstance(pattern, torch.Tensor) or pattern.dim() != 4 or pattern.shape[-1] != pattern.shape[-2]:
        raise VitscopeValueError("expected an attention pattern [B, H, N, N], got "
                                 f"{tuple(getattr(pattern, 'shape', ()))}")
    h, w = (int(v) for v in grid)
    n, p = pattern.shape[-1], int(num_prefix)
    if needs and set(needs) <= _ANY_LAYOUT:  # nothing that reads the token grid
        return h, w, p
    if p < 0 or h < 1 or w < 1 or p + h * w != n:
        raise VitscopeValueError(
            f"the pattern has N = {n} tokens but grid {h}x{w} plus {p} prefix tokens makes {p + h * w}; "
            "pass the batch's grid and the model's number of prefix tokens"
        )
    unknown = set(needs) - QUANTITIES
    if unknown:
        raise VitscopeValueError(f"unknown attention quantities {sorted(unknown)}; known: {sorted(QUANTITIES)}")
    if "cls" in needs and p < 1:
        raise VitscopeValueError("the CLS map needs a CLS token, but this model has no prefix tokens")
    return h, w, p


def block_statistics(
    pattern: torch.Tensor, grid: Sequence[int], num_prefix: int, needs: Iterable[str],
    workspace: Workspace | None = None, compiled: bool = False,
) -> BlockStats:
    """Compute the requested quantities of one block's pattern in one pass (module docstring).

    Float64 patterns are computed in float64, anything else in float32. The pattern must be
    non-negative (a softmax output, or the random baseline). With a workspace, a pattern larger than
    :data:`~vitscope.functional.image_groups.GROUP_BYTES` is worked through in groups of images, so the work
    buffers stay that small; the
    per-image quantities are the same, and ``aligned`` is summed over the groups in float64.

    Args:
        pattern: ``[B, H, N, N]`` attention of one block.
        grid: ``(h, w)`` with ``h * w = N - num_prefix``.
        num_prefix: P prefix tokens (CLS first when P >= 1).
        needs: names from :data:`QUANTITIES`.
        workspace: reusable work buffers (None: fresh temporaries).
        compiled: compute through ``torch.compile`` (:mod:`vitscope.functional.compiled`): the steps fuse into a
            few passes over the pattern instead of about thirty, at the price of one compilation per process and
            float32 rounding (a few units in 1e-7) against the op-by-op numbers.

    Returns:
        :class:`BlockStats` with the requested fields set.
    """
    needs = frozenset(needs)
    _check(pattern, grid, num_prefix, needs)
    step = images_per_group(pattern[:1].numel() * pattern.element_size())
    if workspace is None or pattern.shape[0] <= step:
        return _statistics(pattern, grid, num_prefix, needs, workspace, compiled)
    parts = [_statistics(pattern[i:i + step], grid, num_prefix, needs, workspace, compiled)
             for i in range(0, pattern.shape[0], step)]
    out = BlockStats(batch_size=pattern.shape[0], num_heads=parts[0].num_heads, grid=parts[0].grid,
                     num_prefix=parts[0].num_prefix)
    for name in _FIELDS:
        values = [getattr(part, name) for part in parts]
        if values[0] is not None:
            setattr(out, name, torch.stack(values).sum(dim=0) if name == "aligned" else torch.cat(values))
    out.fused = {mode: torch.cat([part.fused[mode] for part in parts]) for mode in parts[0].fused}
    return out


def _statistics(
    pattern: torch.Tensor, grid: Sequence[int], num_prefix: int, needs: Iterable[str],
    workspace: Workspace | None = None, compiled: bool = False,
) -> BlockStats:
    """One group of images of :func:`block_statistics`."""
    h, w, p = _check(pattern, grid, num_prefix, needs)
    needs = frozenset(needs)
    b, heads = pattern.shape[:2]
    out = BlockStats(batch_size=b, num_heads=heads, grid=(h, w), num_prefix=p)
    if b == 0:
        return out
    if compiled:
        values = compiled_call(_dense, p=p, needs=needs)(pattern)
    else:
        values = _dense(pattern, p, needs, workspace)
    rows = values.pop("aligned_rows", None)
    if rows is not None:
        out.aligned = _aligned_canvas(rows, grid_tables((h, w), pattern.device))
    out.fused = {mode: values.pop(f"fused_{mode}") for mode in FUSIONS if f"fused_{mode}" in values}
    for name, value in values.items():
        setattr(out, name, value)
    return out


def _dense(pattern: torch.Tensor, p: int, needs: frozenset[str], workspace: Workspace | None = None
           ) -> dict[str, torch.Tensor]:
    """Every requested quantity that reads the whole pattern, by name (``aligned_rows``: the renormalised spatial
    rows summed over images, ``[H, K, K]``, for :func:`_aligned_canvas`). Without a workspace it allocates
    freely: what ``compiled`` compiles (:mod:`vitscope.functional.compiled`)."""
    dtype = torch.float64 if pattern.dtype == torch.float64 else torch.float32
    a = pattern.detach().to(dtype)
    sp = a[..., p:, p:]  # spatial block (a view)
    out: dict[str, torch.Tensor] = {}
    if "cls" in needs:
        out["cls"] = a[:, :, 0, p:].clone()  # a copy: a view would keep the whole pattern alive
    if "colsum" in needs:
        out["colsum"] = sp.sum(dim=-2)
    rowsum = sp.sum(dim=-1) if needs & {"rowsum", "aligned", "focus"} else None
    if "rowsum" in needs:
        out["rowsum"] = rowsum
    if "aligned" in needs:
        out["aligned_rows"] = _aligned_rows(sp, rowsum, dtype, workspace)
    if "entropy" in needs:
        out["entropy"] = mean_row_entropy(a, _scratch(workspace, a, dtype))
    if "focus" in needs:
        out["focus"] = mean_spatial_focus(sp, rowsum, _scratch(workspace, sp, dtype),
                                          _scratch(workspace, sp, dtype, 1))
    if "peak" in needs:
        out["peak"] = a.amax(dim=-1).mean(dim=-1)
    for mode in FUSIONS:
        if f"fused_{mode}" in needs:
            out[f"fused_{mode}"] = {"mean": a.mean, "max": a.amax, "min": a.amin}[mode](dim=1)
    return out


def _aligned_rows(sp: torch.Tensor, rowsum: torch.Tensor, dtype: torch.dtype, workspace: Workspace | None
                  ) -> torch.Tensor:
    """The spatial rows renormalised to sum 1, summed over images: ``[H, K, K]``.

    The AAAM is linear in the spatial attention, so the batch's rows are summed over images first and scattered
    once (:func:`_aligned_canvas`), instead of scattering every image.
    """
    safe = torch.where(rowsum == 0, torch.ones_like(rowsum), rowsum)  # a row with no spatial mass stays 0
    buf = _scratch(workspace, sp, dtype)
    rows = torch.div(sp, safe.unsqueeze(-1)) if buf is None else torch.div(sp, safe.unsqueeze(-1), out=buf)
    return rows.sum(dim=0)


def _aligned_canvas(summed: torch.Tensor, tables: GridTables) -> torch.Tensor:
    """Sum over images of the per-image AAAM: ``[H, C]`` float64 (each image's map divides by K), from
    :func:`_aligned_rows`."""
    heads, k, _ = summed.shape
    canvas = torch.zeros(heads, tables.cell_distance.numel(), dtype=torch.float64, device=summed.device)
    canvas.index_add_(1, tables.canvas_index, summed.reshape(heads, k * k).to(torch.float64))
    return canvas / k


def random_patterns(seed: int, kind: str, samples: int, num_blocks: int, num_heads: int, grid: tuple[int, int],
                    num_prefix: int) -> Iterator[torch.Tensor]:
    """The random baseline's patterns, block by block: ``random_attention([samples, H, N, N])`` (float64, rows
    summing to 1) drawn in block order from one generator seeded with ``seed`` (docs/methods.md, Random
    baselines)."""
    gen = torch.Generator().manual_seed(int(seed))
    h, w = grid
    n = num_prefix + h * w
    for _ in range(num_blocks):
        yield random_attention((samples, num_heads, n, n), gen, kind=kind, dtype=torch.float64)


@functools.lru_cache(maxsize=4)
def random_block_statistics(
    seed: int, kind: str, samples: int, num_blocks: int, num_heads: int, grid: tuple[int, int], num_prefix: int
) -> tuple[BlockStats, ...]:
    """Every quantity but the fused maps of the random baseline, per block; cached per configuration.

    The patterns are :func:`random_patterns`: row-stochastic, like a model's, so every quantity is computed
    exactly as for the model (docs/methods.md, Random baselines). The fused maps (``[samples, N, N]`` per
    block and fusion, gigabytes at high token counts) are left out: fold them from :func:`random_patterns`
    instead.
    """
    needs = set(QUANTITIES) - {"rowsum"} - {f"fused_{m}" for m in FUSIONS} - ({"cls"} if num_prefix < 1 else set())
    workspace = Workspace()  # bounded work buffers: at high token counts the samples are worked through in groups
    return tuple(block_statistics(r, grid, num_prefix, needs, workspace)
                 for r in random_patterns(seed, kind, samples, num_blocks, num_heads, grid, num_prefix))
