"""What each latent of a sparse autoencoder responds to, in one pass over the data: its firing frequency, its mean
activation per image class and per region (object, part, background) under the tokens, and its top images with the
latent's activation over their patches.

The SAE reads its hook's tokens as it was trained to (``vitscope sae train``; SAELens, ViT-Prisma and overcomplete
files load too); a latent fires on a token when its code is positive. An image's score for a latent is the latent's
largest code over the image's tokens (the tokens the SAE reads), and the top-k heaps are kept exactly as
``top_activations`` keeps its units' (ties to the smaller dataset index), so merged passes equal one pass.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitscope.analyses.activations.sae_features_result import SAEFeaturesResult
from vitscope.analyses.activations.top import TopActivations, _padded, spatial_units
from vitscope.analyses.base import Batch, Result
from vitscope.analyses.registry import register_analysis
from vitscope.autoencoders.files import load
from vitscope.autoencoders.model import SparseAutoencoder
from vitscope.autoencoders.tokens import TOKENS_OF
from vitscope.errors import VitscopeValueError
from vitscope.functional.concept_tokens import BACKGROUND
from vitscope.functional.topk import merge_topk
from vitscope.models.digest import tensors_digest
from vitscope.models.spec import ModelSpec
from vitscope.occlusion.regions import token_regions

__all__ = ["SAEFeatures"]

#: the target the loading workers fill with ``(grid, [h * w] region label of every token)`` per image
REGION_GRID = "sae_region_grid"
#: codes computed at once at most (tokens x latents): bounds the memory of one batch's encoding
_CHUNK = 1 << 25
#: bytes the patch maps may take when ``maps_for`` is None
_MAP_BYTES = 1 << 28


def _regions_of(regions: tuple[Any, Any], spec: ModelSpec) -> tuple[tuple[int, int], Any]:
    masks, labels = regions
    return token_regions(masks, [int(v) for v in labels], spec)


@register_analysis("sae_features", groups=("sae",), default=False, order=230)
class SAEFeatures(TopActivations):
    """Firing frequency, mean activation per class and per region, and top images with patch maps of every latent
    of a sparse autoencoder.

    Args:
        path: the SAE: a folder written by ``vitscope sae train`` (SAELens's layout, SAELens's own files too), a
            ViT-Prisma folder or an overcomplete ``.pt`` state dict. Required.
        k: top images kept per latent.
        latents: keep the top images of only these latents (None: every latent).
        maps_for: latents whose patch maps are kept with their top images, the first ones (None: every latent
            when their maps take at most 256 MB, else as many as fit; listed latents always keep theirs).
        tokens_of: the tokens the SAE reads (``spatial``, ``cls``, ``registers``, ``all``; None: those it was
            trained on, spatial when its file does not say).
        cards: latents drawn as feature cards in the report (the most frequent ones that fire on at most 10 % of the
            tokens), or a list of latent ids.
        featviz_steps: steps of the feature visualisation of each card's encoder direction, drawn on its card by
            ``vitscope analyze`` (0: none; SAEs of spatial tokens only).
        hook: the canonical hook the SAE reads (None: the one its file names; other tools' files may name none, or
            a hook in their own words).
        sae_k: the top-k of an overcomplete ``TopKSAE`` file, which does not hold it (None: it encodes as a ReLU
            SAE); files that record their own k refuse it.
    """

    description = ("What each latent of a sparse autoencoder responds to: how often it fires, its mean activation "
                   "per image class and per region under the tokens (object, part or background), and the images "
                   "and patches that activate it most.")
    summary = "sparse autoencoder latents: frequency, classes, regions, top patches"
    run_only_params = ("workdir", "cards", "featviz_steps")

    def __init__(self, path: str | Path | None = None, k: int = 8, latents: Sequence[int] | None = None,
                 maps_for: int | None = None, tokens_of: str | None = None, cards: int | Sequence[int] = 6,
                 featviz_steps: int = 64, hook: str | None = None, sae_k: int | None = None) -> None:
        super().__init__(hooks=None, k=k, channels=latents, maps_for=maps_for)
        if tokens_of is not None and tokens_of not in TOKENS_OF:
            raise VitscopeValueError(f"tokens_of must be one of {', '.join(TOKENS_OF)}, got {tokens_of!r}")
        if featviz_steps < 0:
            raise VitscopeValueError(f"featviz_steps must be >= 0, got {featviz_steps}")
        self._cfg_path = None if path is None else str(path)
        self._cfg_tokens_of = tokens_of
        self._cfg_cards = int(cards) if isinstance(cards, int) else tuple(int(c) for c in cards)
        self._cfg_featviz_steps = int(featviz_steps)
        self._cfg_hook = hook
        if sae_k is not None and int(sae_k) < 1:
            raise VitscopeValueError(f"sae_k must be >= 1, got {sae_k}")
        self._cfg_sae_k = None if sae_k is None else int(sae_k)
        # per latent, over the tokens the SAE reads: how many it fired on, the sum of its codes
        self.add_state("fired", None, reduce="sum")
        self.add_state("code_sum", None, reduce="sum")
        self.add_state("tokens", 0, reduce="sum")
        # image class -> [L] sum of codes over its images' tokens; class -> tokens
        self.add_state("class_sum", {}, reduce="sum")
        self.add_state("class_tokens", {}, reduce="sum")
        # region label under a spatial token (-1: background) -> [L] sum of codes; region -> tokens
        self.add_state("region_sum", {}, reduce="sum")
        self.add_state("region_tokens", {}, reduce="sum")
        self.add_state("region_images", 0, reduce="sum")  # images whose masks were placed on the hook's grid

    # -- the SAE ---------------------------------------------------------------------------------
    @property
    def sae(self) -> SparseAutoencoder:
        """The autoencoder, read from :attr:`path` once."""
        held = self.__dict__.get("_sae")
        if held is None:
            if self._cfg_path is None:
                raise VitscopeValueError("sae_features needs an SAE: --param sae_features.path=DIR")
            held = load(self._cfg_path, k=self._cfg_sae_k).eval()
            self.__dict__["_sae"] = held
        return held

    def keyed_params(self) -> dict[str, Any]:
        """The parameters plus a digest of the SAE's weights: a state saved with another SAE at the same path (one
        trained again, say) neither resumes nor merges."""
        keyed = super().keyed_params()
        if self._cfg_path is not None:
            held = self.__dict__.get("_sae_digest")
            if held is None:
                held = self.__dict__["_sae_digest"] = tensors_digest(self.sae.state_dict())
            keyed["sae_weights"] = held
        return keyed

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_sae", None)
        state.pop("_sae_digest", None)  # read again from its file: checkpoints and worker copies stay small
        return state

    @property
    def hook(self) -> str:
        return self._cfg_hook or str(getattr(self.sae, "hook", None) or "")

    @property
    def tokens_of(self) -> str:
        if self._cfg_tokens_of is not None:
            return self._cfg_tokens_of
        trained = getattr(self.sae, "tokens_of", None)
        return trained if trained in TOKENS_OF else "spatial"

    def why_unsupported(self, spec: ModelSpec) -> str | None:
        if self._cfg_path is None:
            return ("analysis 'sae_features' needs an SAE: --param sae_features.path=DIR (a folder from vitscope sae "
                    "train, or SAELens, ViT-Prisma or overcomplete files)")
        try:
            sae = self.sae
        except (OSError, ValueError) as err:
            return f"analysis 'sae_features' cannot read its SAE: {err}"
        trained_on = getattr(sae, "model", None)
        if trained_on and trained_on != spec.name:
            return f"analysis 'sae_features': this SAE was trained on {trained_on}, not {spec.name}"
        if not self.hook:
            return (f"analysis 'sae_features': the SAE at {self._cfg_path} does not say which hook it reads; "
                    "name it: --param sae_features.hook=blocks.N.resid_post")
        wanted = self._cfg_channels if isinstance(self._cfg_channels, tuple) else ()
        bad = [c for c in wanted if isinstance(c, int) and not 0 <= c < sae.d_sae]
        if bad:
            return f"analysis 'sae_features': latents {bad} do not exist ({sae.d_sae} latents)"
        if not spec.is_transformer and self.tokens_of not in ("spatial", "all"):
            return f"analysis 'sae_features': a CNN has no {self.tokens_of} tokens"
        if self.tokens_of in ("cls", "registers") and ("cls" if self.tokens_of == "cls" else "reg") not in tuple(
                spec.prefix_kinds):
            return f"analysis 'sae_features': {spec.name} has no {self.tokens_of} tokens"
        width = spec.embed_dim if self.hook.endswith(("resid_pre", "resid_post", "resid_mid", "embed")) else \
            spec.mlp_dim if self.hook.endswith("mlp.post") else None
        if width and spec.is_transformer and width != sae.d_in:
            return (f"analysis 'sae_features': the SAE reads {sae.d_in} channels but {self.hook} of {spec.name} has "
                    f"{width}")
        return None

    def patterns(self, spec: ModelSpec) -> tuple[str, ...]:
        return (self.hook,) if self._cfg_path is not None else ()

    def target_transforms(self, spec: ModelSpec) -> dict[str, tuple[str, Any]]:
        """Every token's region (the source's region masks: objects, or parts in PartImageNet) in the loaders."""
        return {REGION_GRID: ("regions", functools.partial(_regions_of, spec=spec))}

    # -- the hot loop ----------------------------------------------------------------------------
    def _positions(self, spec: ModelSpec, tokens: int) -> list[int] | None:
        """Token positions the SAE reads of ``tokens`` (None: the spatial ones)."""
        p = spec.num_prefix_tokens if spec.is_transformer else 0
        if self.tokens_of == "spatial":
            return None
        if self.tokens_of == "all":
            return list(range(tokens))
        kind = "cls" if self.tokens_of == "cls" else "reg"
        return [i for i, k in enumerate(spec.prefix_kinds[:p]) if k == kind]

    def _maps_kept(self, latents: int, k_tokens: int) -> int:
        if self._cfg_maps_for is not None:
            return min(self._cfg_maps_for, latents)
        return max(1, min(latents, _MAP_BYTES // max(1, self._cfg_k * k_tokens * 4)))

    @torch.no_grad()
    def reduce_hook(self, name: str, tensor: torch.Tensor, batch: Batch) -> dict[str, Any]:
        """The batch's codes reduced: per latent, every image's score ``[L, B]``, the maps of the kept latents,
        and the sums of codes and firings, per class and per region; chunked so that a batch's codes are never
        all alive at once."""
        spec = batch.spec
        x = tensor.detach().float()
        sae = self.sae.to(x.device)
        if x.shape[-1 if x.dim() == 3 else 1] != sae.d_in:
            raise VitscopeValueError(f"sae_features: {name} has {x.shape[-1 if x.dim() == 3 else 1]} channels but "
                                     f"the SAE reads {sae.d_in}")
        spatial, (h, w) = spatial_units(x, spec, batch.grid)  # [B, K, D]
        full = x if x.dim() == 3 else spatial
        positions = self._positions(spec, full.shape[1])
        wanted = self._channels_for(name)
        latents = list(wanted) if wanted is not None else list(range(sae.d_sae))
        m = len(latents) if wanted is not None else self._maps_kept(sae.d_sae, h * w)
        labels = _labels(batch)
        regions = _regions(batch, (h, w)) if self.tokens_of in ("spatial", "all") else None
        b = x.shape[0]
        idx = torch.as_tensor(batch.indices, dtype=torch.int64).to(x.device, non_blocking=True)
        step = max(1, _CHUNK // max(1, full.shape[1] * sae.d_sae))
        length = spec.max_tokens or h * w
        scores: list[torch.Tensor] = []
        heap: dict[str, torch.Tensor] | None = None  # the batch's own top-k of the mapped latents, chunk by chunk
        sums: dict[str, Any] = {"fired": 0.0, "code_sum": 0.0, "class": {}, "region": {}}
        for lo in range(0, b, step):
            hi = min(b, lo + step)
            with torch.autocast(x.device.type, enabled=False):  # the SAE's codes in float32 under --dtype
                codes = sae.encode(full[lo:hi])  # [b, T, L]
            space = codes if x.dim() == 4 else codes[:, spec.num_prefix_tokens:]
            read = space if positions is None else codes if len(positions) == codes.shape[1] else codes[:, positions]
            best = read.amax(dim=1).double().T  # [L, b]: the max is exact in float32
            best = best if wanted is None else best[latents]
            scores.append(best)
            kept = space[..., :m] if wanted is None else space[..., latents[:m]]
            chunk = {"scores": best[:m], "indices": idx[lo:hi].expand(m, -1),
                     "maps": _padded(kept.permute(2, 0, 1).float(), length)}  # [M, b, K]
            if heap is not None:
                chunk = {key: torch.cat([heap[key], value], dim=1) for key, value in chunk.items()}
            # a latent's images out of the batch's top-k cannot be in the run's: maps never exceed [M, k, K]
            heap = merge_topk(chunk, self._cfg_k, key="scores", tie="indices", dim=1)
            sums["fired"] = sums["fired"] + (read > 0).sum(dim=(0, 1)).double()
            per_image = read.double().sum(dim=1)  # [b, L]
            sums["code_sum"] = sums["code_sum"] + per_image.sum(dim=0)
            _grouped(sums["class"], per_image, labels[lo:hi], read.shape[1])
            if regions is not None:
                _grouped(sums["region"], space.reshape(-1, sae.d_sae).double(), regions[lo:hi].reshape(-1), 1)
        assert heap is not None
        heap["grids"] = torch.tensor([h, w], dtype=torch.int64).to(x.device).expand(*heap["scores"].shape, 2)
        placed = 0 if regions is None else int((regions[:, 0] >= BACKGROUND).sum())
        return {"latents": latents, "scores": torch.cat(scores, dim=1), "mapped": heap, "sums": sums,
                "tokens": b * (read.shape[1]), "indices": idx, "region_images": placed}

    def update(self, record: Mapping[str, torch.Tensor], batch: Batch) -> None:
        if batch.size == 0:
            return
        if self.hook not in record and not self.per_batch(batch):
            raise VitscopeValueError(f"sae_features: the record holds no {self.hook!r}; record the names returned by "
                                     "required_hooks(spec)")
        got = self.reduced(self.hook, record, batch)
        sums = got["sums"]
        self.fired = _add(self.fired, sums["fired"])
        self.code_sum = _add(self.code_sum, sums["code_sum"])
        self.tokens += got["tokens"]
        self.region_images += got["region_images"]
        for store, counts, groups in ((self.class_sum, self.class_tokens, sums["class"]),
                                      (self.region_sum, self.region_tokens, sums["region"])):
            for label, (value, count) in groups.items():
                store[label] = _add(store.get(label), value)
                counts[label] = counts.get(label, 0) + count
        # the batch's own top-k of the mapped latents: maps of only the images that can still be kept
        self._merge_heaps(self.hook, got["latents"], {"scores": got["scores"], "indices": got["indices"].expand(
            len(got["latents"]), -1)}, got["mapped"])
        self.num_images += batch.size
        self._keep_candidates(batch)

    # -- the result ------------------------------------------------------------------------------
    def compute(self) -> Result:
        top = super().compute()
        tensors, meta = dict(top.tensors), dict(top.meta)
        if self.fired is not None:
            n = max(1, self.tokens)
            tensors["frequency"] = (self.fired / n).double().cpu()
            tensors["mean_activation"] = (self.code_sum / n).double().cpu()
            for key, store, counts in (("class", self.class_sum, self.class_tokens),
                                       ("region", self.region_sum, self.region_tokens)):
                labels = sorted(store)
                if labels:
                    tensors[f"{key}_mean"] = torch.stack([store[c].double().cpu() / max(1, counts[c])
                                                          for c in labels])
                    tensors[f"{key}_tokens"] = torch.tensor([float(counts[c]) for c in labels], dtype=torch.float64)
                meta[f"{key}_labels"] = labels
            meta["cards"] = self._cards(tensors["frequency"], meta)
        sae = self.sae if self._cfg_path is not None else None
        meta["sae"] = {"path": self._cfg_path, "hook": self.hook if self._cfg_path else None,
                       "d_sae": None if sae is None else sae.d_sae, "d_in": None if sae is None else sae.d_in,
                       "kind": None if sae is None else sae.kind, "tokens_of": self.tokens_of if sae else None}
        meta["tokens"] = self.tokens
        meta["region_images"] = self.region_images
        # a direction's picture is made of spatial tokens: an SAE of the CLS or registers gets none
        meta["featviz_steps"] = self._cfg_featviz_steps if self.tokens_of in ("spatial", "all") else 0
        return SAEFeaturesResult(name=self.name, tensors=tensors, meta=meta)

    def _cards(self, frequency: torch.Tensor, meta: Mapping[str, Any]) -> list[int]:
        """The latents drawn as cards: those asked for, or the most frequent that fire on at most 10 % of the
        tokens, among the latents whose maps are kept."""
        mapped = list(meta.get("mapped", {}).get(self.hook, []))
        if isinstance(self._cfg_cards, tuple):
            return [c for c in self._cfg_cards if c in set(mapped)]
        alive = [c for c in mapped if 0 < float(frequency[c]) <= 0.1]
        alive.sort(key=lambda c: (-float(frequency[c]), c))
        return alive[: self._cfg_cards]


def _add(held: torch.Tensor | None, value: torch.Tensor) -> torch.Tensor:
    return value if held is None else held.to(value.device) + value


def _labels(batch: Batch) -> list[int | None]:
    """The image class of every image of the batch (None: unknown), host data."""
    labels = (batch.targets or {}).get("label")
    if labels is None or len(labels) != batch.size:
        return [None] * batch.size
    out = []
    for v in labels:
        v = None if v is None else int(v)
        out.append(None if v is None or v < 0 else v)
    return out


def _regions(batch: Batch, grid: tuple[int, int]) -> np.ndarray | None:
    """``[B, K]`` int64 region label of every spatial token (host data), or None when no image has masks; an image
    without masks, or whose masks were placed on another grid than the hook's (a CNN stage of another stride),
    gets labels below :data:`BACKGROUND` and counts nowhere."""
    ready = (batch.targets or {}).get(REGION_GRID)
    if ready is None or len(ready) != batch.size or all(r is None for r in ready):
        return None
    k = grid[0] * grid[1]
    rows = []
    for r in ready:
        if r is not None and tuple(r[0]) == tuple(grid) and len(r[1]) == k:
            rows.append(np.asarray(r[1], dtype=np.int64))
        else:
            rows.append(np.full(k, BACKGROUND - 1, dtype=np.int64))
    return np.stack(rows)


def _grouped(out: dict[int, Any], rows: torch.Tensor, labels: Sequence[int | None] | np.ndarray,
             tokens_per_row: int) -> None:
    """Add ``rows [n, L]`` into ``out[label] = (sum [L], tokens)`` by the host labels of the rows (None and labels
    below :data:`BACKGROUND` are left out), with one matrix product on the rows' device."""
    values = np.array([BACKGROUND - 1 if v is None else int(v) for v in labels], dtype=np.int64)
    kept = np.unique(values[values >= BACKGROUND])
    if not len(kept):
        return
    onehot = values[None, :] == kept[:, None]  # [U, n]
    counts = onehot.sum(axis=1)
    sums = torch.from_numpy(onehot.astype(np.float64)).to(rows.device, non_blocking=True) @ rows  # [U, L]
    for i, v in enumerate(int(v) for v in kept):
        s, c = out.get(v, (None, 0))
        out[v] = (sums[i] if s is None else s + sums[i], c + int(counts[i]) * tokens_per_row)
