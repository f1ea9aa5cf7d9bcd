"""Artifacts of a ViT in one pass: high-norm outlier tokens, the attention they (and the prefix tokens) absorb,
massive activations, and the MLP units that write the outliers (docs/methods.md, "Artifacts").

Outliers follow Darcet et al. 2024 ("Vision Transformers Need Registers"): patch tokens whose norm sits in the upper
mode of a bimodal norm distribution. Every quantity that depends on which tokens are outliers is summed per norm bin
of a fixed logarithmic scale (:class:`~vitscope.functional.artifacts.NormBins`), so the states merge exactly, and the
threshold is chosen after the pass at a bin edge (or set by hand): the counts above it are exact.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from vitscope.analyses.attention.saliency import MASK_GRID, _grid_of_masks, mask_to_grid
from vitscope.analyses.base import Analysis, Batch
from vitscope.analyses.batch import thumbnails
from vitscope.analyses.diagnostics.artifacts_result import ArtifactsResult, summarise
from vitscope.analyses.grids import grid_key
from vitscope.analyses.registry import register_analysis
from vitscope.analyses.state import added, first_seen
from vitscope.errors import VitscopeValueError
from vitscope.functional.artifacts import NormBins, massive_activations, patch_variance
from vitscope.hooks.names import split_block_name
from vitscope.models.spec import ModelSpec

__all__ = ["Artifacts", "ArtifactsResult"]

_SITES = ("resid_pre", "attn.pattern", "mlp.post", "resid_post")


@register_analysis("artifacts", groups=("artifacts",), default=False, order=220)
class Artifacts(Analysis):
    """High-norm tokens, attention sinks, registers, massive activations and register neurons, per block.

    Rows of the per-token quantities are the embedding output (row 0, the input of the first block) and every
    block's output (row ``i + 1``): a block's attention reads row ``i``, its MLP writes row ``i + 1``.

    Args:
        threshold: outlier norm, the same for every row (None: chosen per row by
            :func:`~vitscope.functional.artifacts.split_threshold`, none where the norms are not bimodal).
        max_share: automatic threshold: the largest share of patch tokens the outliers may be.
        min_ratio: automatic threshold: least ratio of the outliers' mean norm to the others'.
        massive_absolute, massive_relative: a massive activation exceeds both ``massive_absolute`` and
            ``massive_relative`` times the median magnitude of its hidden state (Sun et al. 2024: 100, 1,000).
        sink_share: a head is a sink head where its CLS attention to the outliers is at least this share (Gu et
            al. 2024 call a token a sink above 0.3); without a CLS token, where the mean attention the outliers
            receive over all queries is (Gu et al.'s own score; meta ``sink_criterion`` says which).
        top_neurons: register neurons listed (Jiang et al. 2025 use 10 to 50).
        images: dataset indices whose norm maps are kept for the outlier-map figure.

    Result tensors (``R`` = blocks + 1 rows, ``NB`` norm bins, ``H`` heads, ``P`` prefix tokens, ``K`` patches):
    ``norm_histogram`` ``[R, NB]``, ``norm_edges`` ``[NB + 1]``, ``threshold``, ``outlier_fraction``,
    ``norm_mean``, ``norm_max`` ``[R]``, ``prefix_norm`` ``[R, P]``, ``outlier_positions`` ``[R, h, w]`` (share of
    images with an outlier there), ``outlier_pixel_variance`` / ``pixel_variance`` and ``outlier_object_fraction``
    / ``object_fraction`` ``[R]`` (outliers beside every patch), ``sink_cls_outliers``, ``sink_all_outliers``
    ``[L, H]``, ``sink_cls_prefix``, ``sink_all_prefix`` ``[L, H, P]``, ``massive_count``, ``massive_max_ratio``,
    ``massive_max`` ``[L]``, ``massive_top3`` ``[L, 3]``, ``massive_median`` ``[L]``, ``massive_ratio_by_dim``
    ``[L, D]``, ``massive_count_by_token`` ``[L, P + 1]`` (each prefix token, then all patches),
    ``neuron_outlier_mean``, ``neuron_concentration`` ``[L, Dm]``; ``norm_maps`` ``[n, R, h, w]`` and ``pictures``
    for the kept images. meta: ``first_block``, ``thresholds``, ``sink_heads`` and ``sink_criterion``,
    ``register_neurons``...
    """

    description = ("Artifacts: high-norm outlier tokens per block (where they sit, from which block), the attention "
                   "they and the registers absorb, massive activations and the MLP units that write them.")
    summary = "high-norm tokens, sinks, massive activations"
    needs_transformer = True

    def __init__(self, threshold: float | None = None, max_share: float = 0.1, min_ratio: float = 4.0,
                 massive_absolute: float = 100.0, massive_relative: float = 1000.0, sink_share: float = 0.3,
                 top_neurons: int = 10, images: Sequence[int] = (0, 1, 2, 3)) -> None:
        super().__init__()
        if threshold is not None and not threshold > 0:
            raise VitscopeValueError(f"threshold must be a positive norm or None, got {threshold}")
        if not 0 < max_share < 1 or not min_ratio > 1:
            raise VitscopeValueError(f"max_share must be in (0, 1) and min_ratio above 1, got {max_share}, {min_ratio}")
        if not massive_absolute >= 0 or not massive_relative >= 1 or not 0 < sink_share <= 1 or top_neurons < 1:
            raise VitscopeValueError("massive_absolute >= 0, massive_relative >= 1, sink_share in (0, 1] and "
                                     "top_neurons >= 1 are needed")
        self._cfg = {"threshold": threshold, "max_share": float(max_share), "min_ratio": float(min_ratio),
                     "massive_absolute": float(massive_absolute), "massive_relative": float(massive_relative),
                     "sink_share": float(sink_share), "top_neurons": int(top_neurons)}
        self._cfg_images = tuple(int(i) for i in images)
        self.bins = NormBins.through(threshold) if threshold is not None else NormBins()
        self.add_state("sums", {}, reduce="sum")  # quantity -> float64 sums (per grid where positional)
        self.add_state("maxima", {}, reduce="max")
        self.add_state("num_images", 0, reduce="sum")
        self.add_state("blocks", [], reduce="same")
        self.add_state("prefix_kinds", [], reduce="same")
        self.add_state("model", "", reduce="same")
        self.add_state("chosen", {}, reduce=first_seen)  # dataset index -> (norm maps [R, K], picture, grid)

    # -- what the pass records -------------------------------------------------------------------
    def required_hooks(self, spec: ModelSpec) -> list[str]:
        return ["blocks.0.resid_pre", "blocks.*.attn.pattern", "blocks.*.mlp.post", "blocks.*.resid_post"]

    def stream_hooks(self, spec: ModelSpec) -> list[str]:
        return self.required_hooks(spec)

    def target_transforms(self, spec: ModelSpec) -> dict[str, tuple[str, Any]]:
        """Object masks on the token grid, made where images decode (the saliency analysis's own)."""
        import functools

        grid = spec.grid_for(*spec.image_size)
        return {MASK_GRID: ("masks", functools.partial(_grid_of_masks, spec=spec, grid=grid))}

    # -- the hot loop ----------------------------------------------------------------------------
    def update_hook(self, name: str, tensor: torch.Tensor, batch: Batch) -> None:
        """One streamed hook; blocks come in order, and in a block ``resid_pre``, the attention pattern, the MLP
        activation and ``resid_post`` in that order: rows are reduced as they come, the attention of a block is
        binned by the norms of its input, the MLP units by the norms of the block's output."""
        where = split_block_name(name)
        if where is None or where[1] not in _SITES:
            return
        block, site = where
        scratch = self.per_batch(batch)
        if site == "resid_pre":
            if not scratch.get("rows"):
                self._row(scratch, tensor, batch, block=None)
        elif site == "attn.pattern":
            scratch.setdefault("sinks", {})[block] = self._sinks(tensor, scratch, batch)
        elif site == "mlp.post":
            scratch["mlp"] = tensor
        else:
            self._row(scratch, tensor, batch, block=block)

    def update(self, record: Mapping[str, torch.Tensor], batch: Batch) -> None:
        """Fold one batch (from the streamed hooks, or from the record when called without the engine)."""
        if batch.size == 0:
            return
        scratch = self.per_batch(batch)
        if not scratch.get("rows"):
            order = {s: k for k, s in enumerate(_SITES)}
            keys = sorted((split_block_name(k)[0], order[split_block_name(k)[1]], k) for k in record
                          if split_block_name(k) and split_block_name(k)[1] in order)
            for _, _, key in keys:
                self.update_hook(key, record[key], batch)
        rows = scratch.get("rows", [])
        if len(rows) < 2:
            raise VitscopeValueError("artifacts: the record lacks blocks.0.resid_pre or blocks.*.resid_post; record "
                                     "required_hooks(spec)")
        blocks = [b for b, _ in rows[1:]]
        if self.blocks and blocks != self.blocks:
            raise VitscopeValueError(f"artifacts: blocks {blocks} differ from those seen before {self.blocks}")
        self.blocks, self.model = blocks, batch.spec.name
        self.prefix_kinds = list(batch.spec.prefix_kinds)
        key = grid_key(batch.grid)
        stacked: dict[str, list[torch.Tensor]] = {}
        for _, reduced in rows:
            for name, value in reduced.items():
                stacked.setdefault(name, []).append(value)
        sinks = scratch.get("sinks", {})
        for name in ("sink_cls", "sink_all", "sink_cls_prefix", "sink_all_prefix"):
            if sinks:
                stacked[name] = [sinks[b][name] for b in blocks]
        for name, values in stacked.items():
            value = torch.stack(values)
            if name.startswith("max_"):
                self.maxima[name] = value if name not in self.maxima else torch.maximum(
                    self.maxima[name].to(value.device), value)
            else:
                target = f"{name}@{key}" if name in _POSITIONAL else name
                self.sums[target] = added(self.sums.get(target), value)
        self.sums["images@" + key] = added(self.sums.get("images@" + key),
                                           torch.full((), float(batch.size), dtype=torch.float64))
        self.num_images += batch.size
        self._keep_images(scratch, batch)

    def _row(self, scratch: dict, x: torch.Tensor, batch: Batch, block: int | None) -> None:
        """Reduce one row (the embedding output, or block ``block``'s output) ``x [B, T, D]``."""
        p, nb = batch.spec.num_prefix_tokens, self.bins.count
        x = x.detach()
        norms = x[:, p:].float().norm(dim=-1)  # [B, K]
        bins = self.bins.of(norms)
        b, k = norms.shape
        ones = torch.ones(b * k, dtype=torch.float64, device=x.device)
        flat = bins.flatten()
        out: dict[str, torch.Tensor] = {
            "hist": torch.zeros(nb, dtype=torch.float64, device=x.device).index_add_(0, flat, ones),
            "positions": torch.zeros(nb * k, dtype=torch.float64, device=x.device).index_add_(
                0, (bins * k + torch.arange(k, device=x.device)).flatten(), ones).reshape(nb, k),
            "norm_sum": norms.double().sum(),
            "max_norm": norms.max().double(),
            "prefix_norm": x[:, :p].float().norm(dim=-1).double().sum(dim=0),
        }
        out.update(self._per_bin_ground_truth(scratch, flat, batch, x.device))
        if block is not None:
            out.update(self._massive(x, p))
            mlp = scratch.pop("mlp", None)
            if mlp is not None:
                act = mlp.detach()[:, p:].abs().reshape(b * k, -1).float()
                out["neuron_sum"] = torch.zeros(nb, act.shape[1], dtype=torch.float32,
                                                device=x.device).index_add_(0, flat, act).double()
        maps = scratch.setdefault("maps", [])
        maps.append(norms)
        scratch["bins"] = bins
        scratch.setdefault("rows", []).append((block, out))

    def _per_bin_ground_truth(self, scratch: dict, flat: torch.Tensor, batch: Batch, device: torch.device
                              ) -> dict[str, torch.Tensor]:
        """Sums per norm bin of each patch's pixel variance and overlap with the objects (images with masks)."""
        nb = self.bins.count
        if "variance" not in scratch:
            scratch["variance"] = _variance(batch)
            scratch["objects"] = _objects(batch)
        out = {}
        if scratch["variance"] is not None:
            out["variance"] = torch.zeros(nb, dtype=torch.float64, device=device).index_add_(
                0, flat, scratch["variance"].to(device).flatten().double())
        objects = scratch["objects"]
        if objects is not None:
            fraction, weight = (t.to(device).flatten() for t in objects)
            out["object"] = torch.zeros(nb, dtype=torch.float64, device=device).index_add_(0, flat, fraction)
            out["object_weight"] = torch.zeros(nb, dtype=torch.float64, device=device).index_add_(0, flat, weight)
        return out

    def _massive(self, x: torch.Tensor, p: int) -> dict[str, torch.Tensor]:
        """Massive activations of one block's output ``x [B, T, D]``."""
        flagged, ratio, median = massive_activations(x, self._cfg["massive_absolute"], self._cfg["massive_relative"])
        magnitude = x.float().abs()
        by_token = torch.cat([flagged[:, :p].sum(dim=(0, 2)), flagged[:, p:].sum().reshape(1)]).double()
        return {"massive_count": flagged.sum().double(), "massive_by_dim": flagged.sum(dim=(0, 1)).double(),
                "massive_by_token": by_token, "massive_top3": magnitude.flatten(1).topk(3, dim=1).values.double()
                .sum(dim=0), "massive_median": median.double().sum(),
                "max_massive_ratio": ratio.amax().double(), "max_massive": magnitude.amax().double(),
                "max_ratio_by_dim": ratio.amax(dim=(0, 1)).double()}

    def _sinks(self, pattern: torch.Tensor, scratch: dict, batch: Batch) -> dict[str, torch.Tensor]:
        """Attention a block gives to its input's tokens, per norm bin of the patch keys and per prefix token: from
        the CLS query (when there is one) and on average over the queries, summed over images."""
        p, nb = batch.spec.num_prefix_tokens, self.bins.count
        a = pattern.detach().float()  # [B, H, T, T]
        b, h = a.shape[:2]
        bins = scratch["bins"]  # [B, K] of the block's input
        index = bins.flatten().expand(h, -1)

        def per_bin(received: torch.Tensor) -> torch.Tensor:  # [B, H, T] -> [H, NB]
            keys = received[:, :, p:].permute(1, 0, 2).reshape(h, -1).double()
            return torch.zeros(h, nb, dtype=torch.float64, device=a.device).scatter_add_(1, index, keys)

        mean = a.mean(dim=2)
        has_cls = p >= 1 and batch.spec.prefix_kinds[:1] == ("cls",)
        cls = a[:, :, 0] if has_cls else torch.full_like(mean, float("nan"))
        return {"sink_cls": per_bin(cls), "sink_all": per_bin(mean),
                "sink_cls_prefix": cls[:, :, :p].double().sum(dim=0), "sink_all_prefix": mean[:, :, :p].double()
                .sum(dim=0)}

    def _keep_images(self, scratch: dict, batch: Batch) -> None:
        wanted = [j for j, i in enumerate(batch.indices) if int(i) in self._cfg_images and int(i) not in self.chosen]
        if not wanted:
            return
        maps = torch.stack(scratch["maps"], dim=1)  # [B, R, K]
        pictures = thumbnails(batch, wanted) if batch.pixels is not None and batch.pixels.dim() == 4 else None
        for n, j in enumerate(wanted):
            picture = None if pictures is None else pictures[n]
            self.chosen[int(batch.indices[j])] = (maps[j].clone(), picture, grid_key(batch.grid))

    # -- results ---------------------------------------------------------------------------------
    def compute(self) -> ArtifactsResult:
        return summarise(self)


#: sums kept per token grid (they have one entry per patch position)
_POSITIONAL = frozenset({"positions"})


def _variance(batch: Batch) -> torch.Tensor | None:
    """``[B, K]`` pixel variance of every patch (None when the pixels are not an image batch on the grid)."""
    pixels, p = batch.pixels, int(batch.spec.patch_size or 0)
    h, w = (int(v) for v in batch.grid)
    if pixels is None or pixels.dim() != 4 or not p or pixels.shape[-2:] != (h * p, w * p):
        return None
    return patch_variance(pixels, p)


def _objects(batch: Batch) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``([B, K] 1 on object patches, [B, K] 1 for images with masks)`` as float64 (host data), or None."""
    targets = batch.targets or {}
    ready, masks = targets.get(MASK_GRID), targets.get("masks")
    if ready is None and masks is None:
        return None
    rows, weights = [], []
    k = int(batch.grid[0]) * int(batch.grid[1])
    for j in range(batch.size):
        r = ready[j] if ready is not None and len(ready) == batch.size else None
        if r is not None and tuple(r[0]) == tuple(batch.grid):
            grid = np.asarray(r[1]).reshape(-1)
        elif masks is not None and len(masks) == batch.size and masks[j] is not None:
            grid = mask_to_grid(masks[j], batch.spec, batch.grid, batch.frame).reshape(-1)
        else:
            grid = None
        rows.append(np.zeros(k) if grid is None else grid.astype(np.float64))
        weights.append(np.full(k, 0.0 if grid is None else 1.0))
    return torch.from_numpy(np.stack(rows)), torch.from_numpy(np.stack(weights))
