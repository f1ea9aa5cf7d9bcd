"""Extract per-block features once and keep them in the feature cache.

``extract_features(backbone, source, requests, cache)`` serves every request from the cache when its key
is there (no forward pass at all); the requests that miss share **one** forward pass per image, whatever
their number: the hooks of all of them are recorded together and every block's tokens are pooled in
every requested way. Rows are streamed into a :class:`~vitscope.features.rowstore.RowStore` and committed
to the cache sorted by image position, so memory stays bounded.
"""

from __future__ import annotations

import contextlib
import shutil
import uuid
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from vitscope.data.images import ImageLoadError
from vitscope.features.cache import CacheEntry, FeatureCache
from vitscope.features.fingerprint import CACHE_FORMAT, digest, model_fingerprint
from vitscope.features.rowstore import RowStore
from vitscope.features.sources import ImageSource, as_source
from vitscope.features.views import StandardView, TiledView, TokenGroup, View
from vitscope.functional.pooling import mask_pool, mask_weights
from vitscope.hooks.names import expand_names
from vitscope.models.backbone import Backbone

if TYPE_CHECKING:  # vitscope.analyses imports this module (its probes extract features): no import cycle
    from vitscope.analyses.base import Analysis

__all__ = ["POOLINGS", "FeatureRequest", "extract_features", "pool_group"]

POOLINGS = ("cls", "spatial_mean", "spatial", "all", "mask")


@dataclass(frozen=True)
class FeatureRequest:
    """Which features to keep for every image (one cache entry per request).

    Attributes:
        site: block site, ``blocks.{i}.<site>``: ``"resid_post"`` (block output), ``"norm1"``, ``"norm2"``,
            ``"resid_pre"``, ``"resid_mid"``, ``"attn_out"`` or ``"mlp_out"``.
        pooling: ``"cls"`` ``[D]``; ``"spatial_mean"`` ``[D]``; ``"spatial"`` ``[K, D]`` (row-major grid);
            ``"all"`` ``[N*D]``; ``"mask"``: one row ``[D]`` per region mask of the image (mask-weighted mean
            of the spatial tokens; extra columns ``label`` and ``region``).
        blocks: block indices to keep; None = every block.
    """

    site: str = "resid_post"
    pooling: str = "cls"
    blocks: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if self.blocks is not None:
            object.__setattr__(self, "blocks", tuple(int(b) for b in self.blocks))

    def block_list(self, num_blocks: int) -> list[int]:
        """The blocks this request keeps on a model with ``num_blocks`` blocks (negative indices count back)."""
        if self.blocks is None:
            return list(range(num_blocks))
        out = sorted({b % num_blocks for b in self.blocks if -num_blocks <= b < num_blocks})
        if len(out) != len(set(self.blocks)):
            raise ValueError(f"blocks {self.blocks} outside 0..{num_blocks - 1}")
        return out

    def hooks(self, num_blocks: int) -> list[str]:
        return [f"blocks.{i}.{self.site}" for i in self.block_list(num_blocks)]


def pool_group(group: TokenGroup, hook: str, pooling: str, weights: list[torch.Tensor] | None = None) -> torch.Tensor:
    """Pool one hook's tokens of a group: ``[b, F]`` (``[b, K, D]`` for "spatial"; for "mask" ``[sum M_i, D]``).

    Args:
        group: tokens of b images sharing a layout.
        hook: the hook name.
        pooling: one of :data:`POOLINGS`.
        weights: for "mask", one ``[M_i, K]`` weight matrix per image of the group.
    """
    x = group.tokens[hook]
    p = group.num_prefix
    if pooling == "cls":
        if p < 1:
            raise ValueError("pooling 'cls' needs a CLS token; tiled features have none (use 'spatial_mean')")
        return x[:, 0]
    if pooling == "spatial_mean":
        return x[:, p:].mean(dim=1)
    if pooling == "spatial":
        return x[:, p:]
    if pooling == "all":
        return x.reshape(x.shape[0], -1)
    if weights is None:
        raise ValueError("pooling 'mask' needs region weights")
    rows = [mask_pool(x[j, p:].double(), w.to(x.device)) for j, w in enumerate(weights)]
    return torch.cat(rows) if rows else x.new_zeros((0, x.shape[-1]))


def _key(model_fp: str, source: ImageSource, view: View, request: FeatureRequest, backbone: Backbone,
         amp: torch.dtype | None) -> str:
    return digest({
        "format": CACHE_FORMAT, "model": model_fp, "view": view.describe(backbone.spec),
        "data": source.fingerprint(with_annotations=request.pooling == "mask"),
        "request": asdict(request), "blocks": request.block_list(backbone.spec.num_blocks), "autocast": str(amp),
    })


def _labels_for(source: ImageSource, analyses: Sequence[Analysis]) -> list[int | None] | None:
    """Image labels by position when a riding analysis needs them (None: not needed or not available)."""
    if not any("label" in getattr(a, "required_targets", ()) for a in analyses):
        return None
    try:
        return [int(v) if v >= 0 else None for v in source.labels()]
    except ValueError:  # no labels: the analysis reports it
        return None


def _load(source: ImageSource, positions: range, need_masks: bool) -> list[tuple[int, object, object]]:
    """Decode a batch; unreadable images are skipped with a warning (their rows are missing)."""
    out = []
    for i in positions:
        try:
            out.append((i, source.image(i), source.masks(i) if need_masks else None))
        except ImageLoadError as err:
            warnings.warn(f"skipping {err}", stacklevel=3)
    return out


def extract_features(
    backbone: Backbone,
    source: ImageSource | object,
    requests: Sequence[FeatureRequest],
    cache: FeatureCache | None = None,
    view: View | None = None,
    batch_size: int = 32,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    analyses: Sequence[Analysis] = (),
) -> dict[FeatureRequest, CacheEntry]:
    """Cached per-block features of every image of ``source`` for each request.

    Args:
        backbone: the model.
        source: an :class:`ImageSource`, a format reader (``DatasetSource``) or a list of paths.
        requests: what to keep; requests served by the cache cost nothing, the others share one pass.
        cache: where entries live (default: :class:`FeatureCache` at its default root).
        view: preprocessing and geometry (default :class:`StandardView`).
        batch_size: images per forward pass (tiled views run the tiles of one image together).
        device: ``"cpu"``, ``"cuda"``... (default: the best available).
        dtype: None/``"fp32"``, or ``"bf16"``/``"fp16"`` autocast (part of the key).
        analyses: accumulators fed every batch of the same pass (their hooks are recorded too; ``batch.targets``
            holds the source's image labels when an analysis requires them), e.g. a streaming ``BlockCKA`` next
            to cached final-block features. With analyses the pass always runs (cached requests are still not
            recomputed). Not with :class:`TiledView`, whose stitched tokens are not the model's layout.

    Returns:
        ``{request: CacheEntry}``; each entry has ``index`` ``[rows]`` (image position), ``block{i}`` per
        kept block (float32), and for mask pooling ``label`` and ``region`` (mask number in its image).
        ``meta`` records the view, the request, and the token ``grid`` / ``frame_hw`` / ``num_prefix`` of the
        first image (``"spatial"`` rows are ``[K, D]`` on that grid, row-major).
    """
    from vitscope.analyses.base import Batch  # at call time: vitscope.analyses imports this module
    from vitscope.engine.run import resolve_device, resolve_dtype

    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    source = as_source(source)
    cache = cache if cache is not None else FeatureCache()
    view = view if view is not None else StandardView()
    spec = backbone.spec
    amp = resolve_dtype(dtype)
    model_fp = model_fingerprint(backbone)
    keys = {r: _key(model_fp, source, view, r, backbone, amp) for r in dict.fromkeys(requests)}
    found = {r: cache.get(k) for r, k in keys.items()}
    missing = [r for r, e in found.items() if e is None]
    if not missing and not analyses:
        return found  # type: ignore[return-value]
    if analyses and isinstance(view, TiledView):
        raise ValueError("analyses cannot ride on a tiled view: stitched tokens are not the model's token layout")
    dev = resolve_device(device)
    backbone.to(dev).eval()
    hooks = list(dict.fromkeys([h for r in missing for h in r.hooks(spec.num_blocks)] + [
        h for a in analyses for h in expand_names(a.required_hooks(spec), backbone.hook_names(), spec.name)]))
    workdir = cache.root / "tmp" / f"rows-{uuid.uuid4().hex}"
    stores = {r: RowStore(workdir=workdir) for r in missing}
    layout: dict[str, object] = {}  # grid of the first group (spatial rows of one entry share one grid)
    need_masks = any(r.pooling == "mask" for r in missing)
    labels = _labels_for(source, analyses)
    autocast = torch.autocast(dev.type, dtype=amp) if amp is not None else contextlib.nullcontext()
    ranges = [range(s, min(s + batch_size, len(source))) for s in range(0, len(source), batch_size)]
    try:
        with torch.inference_mode(), backbone.record(hooks) as rec, ThreadPoolExecutor(max_workers=1) as pool:

            def forward(pixels: torch.Tensor) -> dict[str, torch.Tensor]:
                rec.clear()
                with autocast:
                    backbone(pixels.to(dev))
                return {h: rec[h].float() for h in hooks}

            pending = pool.submit(_load, source, ranges[0], need_masks) if ranges else None
            seen = 0
            for k in range(len(ranges)):
                loaded = pending.result()
                if k + 1 < len(ranges):  # decode the next batch while the model runs
                    pending = pool.submit(_load, source, ranges[k + 1], need_masks)
                if loaded:
                    groups = _add_batch(loaded, view, spec, forward, missing, stores, layout)
                    for group in groups if analyses else ():
                        idx = [loaded[j][0] for j in group.positions]
                        targets = {} if labels is None else {"label": [labels[i] for i in idx]}
                        batch = Batch(pixels=group.pixels, indices=idx, paths=[source.paths[i] for i in idx],
                                      spec=spec, grid=group.grid, targets=targets)
                        for a in analyses:
                            a.update(group.tokens, batch)
                    seen += len(loaded)
        if seen == 0:
            raise ValueError(f"no readable image in {source.name} ({len(source)} files): nothing to extract")
        meta_base = {"model": spec.name, "view": view.describe(spec), "data": source.name, **layout}
        for r in missing:
            meta = {**meta_base, "request": asdict(r), "blocks": r.block_list(spec.num_blocks)}
            found[r] = cache.commit(keys[r], stores[r], meta)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return found  # type: ignore[return-value]


def _add_batch(loaded: list, view: View, spec, forward, requests: list[FeatureRequest],
               stores: dict[FeatureRequest, RowStore], layout: dict[str, object]) -> list[TokenGroup]:
    """Forward one decoded batch through the view, append every request's rows, return the token groups."""
    images = [im for _, im, _ in loaded]
    groups = view.tokens(images, spec, forward)
    for group in groups:
        if not layout:
            layout.update(grid=list(group.grid), frame_hw=list(group.frame_hw), num_prefix=group.num_prefix)
        index = np.array([loaded[j][0] for j in group.positions], dtype=np.int64)
        weights, labels, region = None, None, None
        if any(r.pooling == "mask" for r in requests):
            weights, labels, region = [], [], []
            for j in group.positions:
                masks, mask_labels = loaded[j][2]
                w = mask_weights(view.mask_frame(masks, spec), group.grid)
                keep = w.sum(dim=1) > 0  # a region cropped away covers no token: no row
                weights.append(w[keep])
                labels.append(mask_labels[keep.numpy()])
                region.append(np.flatnonzero(keep.numpy()))
        for r in requests:
            blocks = r.block_list(spec.num_blocks)
            cols = {f"block{i}": pool_group(group, f"blocks.{i}.{r.site}", r.pooling, weights).float().cpu()
                    for i in blocks}
            if r.pooling == "mask":
                counts = [len(w) for w in weights]
                cols["index"] = np.repeat(index, counts)
                cols["label"] = np.concatenate(labels) if labels else np.zeros(0, dtype=np.int64)
                cols["region"] = np.concatenate(region).astype(np.int64) if region else np.zeros(0, dtype=np.int64)
            else:
                cols["index"] = index
            stores[r].append(cols)
    return groups
