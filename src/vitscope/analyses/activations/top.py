"""Most-activating dataset images of every unit, with their patch activation maps (paper 001 figs. 2, 5).

A unit is one channel of a recorded site, scored per image by its mean over spatial tokens (the
feature-visualisation objective, docs/methods.md, Feature visualisation). The state is a top-k heap per unit kept as
sorted tensors; ties are broken by the smaller dataset index, so the order is total and
``merge(A(x1), A(x2)) == A(x1 + x2)`` holds exactly.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from vitscope.analyses.activations.mean import natural_key
from vitscope.analyses.base import Analysis, Batch, Figure, Result
from vitscope.analyses.batch import thumbnails
from vitscope.analyses.registry import register_analysis
from vitscope.analyses.result import SMALL
from vitscope.analyses.state import first_seen
from vitscope.cache.host_copy import LaggedSnapshot
from vitscope.errors import VitscopeValueError
from vitscope.functional.topk import merge_topk
from vitscope.hooks.tokens import site_units
from vitscope.models.spec import ModelSpec

#: units per site that the figures show, and the side in pixels of the pictures kept for them
SHOWN_UNITS = 6
PICTURE_SIDE = 64

__all__ = ["TopActivations", "TopActivationsResult", "spatial_units"]

TRANSFORMER_DEFAULT = ("blocks.*.mlp.post",)
CNN_DEFAULT = ("stages.*",)


def spatial_units(x: torch.Tensor, spec: ModelSpec, grid: tuple[int, int]) -> tuple[torch.Tensor, tuple[int, int]]:
    """Every channel of a site over its spatial positions.

    Args:
        x: tokens ``[B, N, D]``, attention tensors ``[B, H, N, Dh]`` (channels = concatenated heads) or a
            CNN map ``[B, C, h, w]``.
        spec: the model's spec (prefix tokens are dropped).
        grid: the token grid of this batch (transformers).

    Returns:
        ``([B, K, C], (h, w))`` with K = h * w spatial positions, row-major.
    """
    units = site_units(x, spec.num_prefix_tokens, spec.is_transformer, "top_activations")
    return units, grid if spec.is_transformer or x.dim() != 4 else (int(x.shape[2]), int(x.shape[3]))


class TopActivationsResult(Result):
    """Top-k scores, dataset indices and patch maps of every unit.

    Tensors per hook: ``{hook}.scores`` ``[C, k]`` float64 (descending), ``{hook}.indices`` ``[C, k]``
    int64, ``{hook}.maps`` ``[M, k, h, w]`` float32 for the first M of the C channels (their rows of scores
    and indices). Meta: ``paths`` (dataset index -> path of every kept image, keys as strings), ``k``,
    ``hooks``, ``channels`` (hook -> the C kept channel ids), ``mapped`` (hook -> the M channel ids with
    maps), ``num_images``.
    The long table holds scores and indices; the maps go to ``<name>.npz``.
    """

    DIMS = {"*.maps": ("unit", "rank", "row", "column"), "*.map_grids": ("unit", "rank", "axis"),
            "pictures": ("image", "y", "x", "channel"),
            "*": ("unit", "rank")}

    def arrays(self) -> dict[str, torch.Tensor]:
        """The patch maps (``{hook}.maps``), whatever their size, beside the other large tensors."""
        return {k: t for k, t in self.tensors.items() if k.endswith(".maps") or t.numel() > SMALL}

    def figures(self) -> list[Figure]:
        """``<name>_<hook>``: the top images' patch maps of the first six units of every hook."""
        figures = []
        for hook in self.meta.get("hooks", []):
            def draw(path: Path, hook: str = hook) -> list[Path]:
                from vitscope.viz.featviz_figures import top_activation_grid

                maps, scores = self.tensors[f"{hook}.maps"], self.tensors[f"{hook}.scores"]
                maps = map_images(maps, self.tensors.get(f"{hook}.map_grids"))
                channels = self.meta["mapped"][hook][: min(SHOWN_UNITS, len(maps))]
                index = {i: n for n, i in enumerate(self.meta.get("picture_indices", []))}
                pictures = self.tensors.get("pictures")
                rows = self.tensors[f"{hook}.indices"][: len(channels)].tolist()
                under = [[None if pictures is None or int(i) not in index else pictures[index[int(i)]]
                          for i in row] for row in rows]
                paths = self.meta.get("paths", {})
                names = [[Path(paths[str(int(i))]).name if str(int(i)) in paths else None for i in row]
                         for row in rows]
                return top_activation_grid(maps[: len(channels)], scores[: len(channels)],
                                           [f"unit {c}" for c in channels], under, hook, path, names=names)

            figures.append(self.figure(f"_{hook.replace('.', '_')}", draw, "The images that activate each unit "
                                       "most (left: most), each with the unit's activation over its patches drawn "
                                       "on it; the score above is the unit's mean activation over the image, its "
                                       "file name below.",
                                       "paper 001, fig. 2 and 5", title=f"Top activations: {hook}"))
        return figures


def _pictures(batch: Batch, positions: Sequence[int]) -> list[torch.Tensor]:
    """``[S, S, 3]`` uint8 pictures (S = :data:`PICTURE_SIDE`) of the batch's images at ``positions``, on the pixels'
    device: what the figures draw the maps over."""
    if not positions:
        return []
    images = torch.stack(thumbnails(batch, positions)).permute(0, 3, 1, 2).float()  # [n, 3, H, W]
    small = torch.nn.functional.interpolate(images, size=(PICTURE_SIDE, PICTURE_SIDE), mode="area")
    return [p.clone() for p in small.round().to(torch.uint8).permute(0, 2, 3, 1).unbind(0)]


def _padded(maps: torch.Tensor, length: int) -> torch.Tensor:
    """``[M, n, K]`` -> ``[M, n, length]``, NaN after the first ``K``."""
    if maps.shape[-1] == length:
        return maps
    return torch.nn.functional.pad(maps, (0, length - maps.shape[-1]), value=float("nan"))


def _maps_of(key: str, held: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``{key}.maps`` ``[M, k, h, w]`` when every kept image has one grid; else ``[M, k, K]`` (each map its image's
    patches row by row, NaN after them) with ``{key}.map_grids`` ``[M, k, 2]``, every map's ``(h, w)``."""
    maps, grids = held["maps"], held["grids"]
    if grids.numel() and bool((grids == grids.reshape(-1, 2)[0]).all()):
        h, w = (int(v) for v in grids.reshape(-1, 2)[0])
        return {f"{key}.maps": maps[..., : h * w].reshape(*maps.shape[:2], h, w).clone()}
    return {f"{key}.maps": maps.clone(), f"{key}.map_grids": grids.clone()}


def map_images(maps: torch.Tensor, grids: torch.Tensor | None) -> list[list[torch.Tensor]]:
    """Every map of :func:`_maps_of`'s output as its own ``[h, w]`` tensor: ``out[u][j]``."""
    if grids is None:
        return [[maps[u, j] for j in range(maps.shape[1])] for u in range(maps.shape[0])]
    return [[maps[u, j, : int(grids[u, j, 0]) * int(grids[u, j, 1])].reshape(int(grids[u, j, 0]),
                                                                              int(grids[u, j, 1]))
             for j in range(maps.shape[1])] for u in range(maps.shape[0])]


@register_analysis("top_activations", order=150)
class TopActivations(Analysis):
    """Keep the ``k`` most-activating images of every unit of the chosen sites, with their patch maps.

    Args:
        hooks: sites or patterns (default ``blocks.*.mlp.post``; CNNs ``stages.*``).
        k: images kept per unit.
        channels: keep only these channel ids of every site, or a mapping ``site or pattern -> ids``
            (sites it does not name keep every channel). Default: all channels.
        maps_for: patch maps are kept for the first ``maps_for`` channels of a site whose channels were not
            listed (None: all). Maps cost ``k x h x w`` floats per channel (a ViT-S/14 at 518 px: 6 MB per
            block for 384 channels at k=5), while scores and indices of every channel are small; listed
            channels always keep their maps.
    """

    description = ("The dataset images that activate each unit most (a top-k kept in one streaming pass), with the "
                   "unit's activation over their patches.")
    summary = "most-activating images of every unit"


    def __init__(self, hooks: Sequence[str] | str | None = None, k: int = 5,
                 channels: Sequence[int] | Mapping[str, Sequence[int]] | None = None,
                 maps_for: int | None = 16) -> None:
        super().__init__()
        if k < 1:
            raise VitscopeValueError(f"k must be >= 1, got {k}")
        if maps_for is not None and maps_for < 0:
            raise VitscopeValueError(f"maps_for must be >= 0 or None, got {maps_for}")
        self._cfg_maps_for = None if maps_for is None else int(maps_for)
        self._cfg_hooks = (hooks,) if isinstance(hooks, str) else (tuple(hooks) if hooks is not None else None)
        self._cfg_k = int(k)
        if isinstance(channels, Mapping):
            self._cfg_channels = tuple((str(k), tuple(int(c) for c in v)) for k, v in channels.items())
        else:
            self._cfg_channels = None if channels is None else tuple(int(c) for c in channels)
        # per hook, best first: {"scores" [C, k] float64, "indices" [C, k] int64} of every kept channel, and
        # the same heap with "maps" [M, k, h, w] float32 for the first M channels (same order: same scores, tie)
        self.add_state("top", {}, reduce="topk", key="scores", tie="indices", k=self._cfg_k, dim=1)
        self.add_state("mapped", {}, reduce="topk", key="scores", tie="indices", k=self._cfg_k, dim=1)
        self.add_state("channels", {}, reduce="same")  # hook -> kept channel ids
        self.add_state("paths", {}, reduce=first_seen)  # dataset index -> path, for the kept images
        # dataset index -> [S, S, 3] uint8 picture of the images the figures show (the top images of the first
        # SHOWN_UNITS units with maps of every site): the figures draw each map over its image
        self.add_state("pictures", {}, reduce=first_seen)
        self.add_state("num_images", 0, reduce="sum")

    def _channels_for(self, key: str) -> tuple[int, ...] | None:
        """The channel ids kept at ``key`` (None: all)."""
        cfg = self._cfg_channels
        if cfg is None or not cfg or not isinstance(cfg[0], tuple):
            return cfg
        for pattern, ids in cfg:
            if fnmatch.fnmatchcase(key, pattern):
                return ids
        return None

    def patterns(self, spec: ModelSpec) -> tuple[str, ...]:
        if self._cfg_hooks is not None:
            return self._cfg_hooks
        return TRANSFORMER_DEFAULT if spec.is_transformer else CNN_DEFAULT

    def required_hooks(self, spec: ModelSpec) -> list[str]:
        return list(self.patterns(spec))

    def update(self, record: Mapping[str, torch.Tensor], batch: Batch) -> None:
        patterns = self.patterns(batch.spec)
        keys = [k for k in record if any(fnmatch.fnmatchcase(k, p) for p in patterns)]
        if not keys:
            raise VitscopeValueError(f"top_activations: the record holds none of {list(patterns)}; record "
                                     "the names returned by required_hooks(spec)")
        idx = None
        for key in keys:
            channels, scores, maps = self.reduced(key, record, batch)
            if idx is None:
                idx = torch.as_tensor(batch.indices, dtype=torch.int64).to(scores.device)
            self._fold(key, channels, scores, idx.expand(len(channels), -1), maps)
        self.num_images += batch.size
        self._keep_candidates(batch)

    def stream_hooks(self, spec: ModelSpec) -> list[str]:
        return list(self.patterns(spec))

    def reduce_hook(self, name: str, tensor: torch.Tensor, batch: Batch
                    ) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """``(channels, scores [C, B], maps [M, B, h, w])`` of one hook: every unit's mean over the spatial
        positions of each image, and the maps of the units whose maps are kept."""
        units, (h, w) = spatial_units(tensor.detach(), batch.spec, batch.grid)  # [B, K, C]
        wanted = self._channels_for(name)
        if wanted is not None:
            bad = [c for c in wanted if not 0 <= c < units.shape[-1]]
            if bad:
                raise VitscopeValueError(f"top_activations: channels {bad} do not exist at '{name}' "
                                         f"({units.shape[-1]} channels)")
            units = units[..., list(wanted)]
        channels = list(wanted) if wanted is not None else list(range(units.shape[-1]))
        m = len(channels) if wanted is not None or self._cfg_maps_for is None else min(self._cfg_maps_for,
                                                                                          len(channels))
        scores = units.double().mean(dim=1).T  # [C, B]
        # a copy: a view would keep the whole [B, K, C] activation alive while later blocks run
        maps = units[..., :m].float().permute(2, 0, 1).reshape(m, -1, h * w).clone()  # [M, B, h*w]
        # images of several grids (a token budget): every map as long as the budget, so heaps of any grid (and
        # of other processes) line up
        maps = _padded(maps, batch.spec.max_tokens or h * w)
        grids = torch.tensor([h, w], dtype=torch.int64).to(maps.device).expand(m, maps.shape[1], 2)
        return channels, scores, (maps, grids)

    def _fold(self, key: str, channels: list[int], scores: torch.Tensor, indices: torch.Tensor,
              maps: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Merge candidates ``scores [C, n]``, ``indices [C, n]`` and ``maps``: ``([M, n, K], grids [M, n, 2])``
        (each map its image's ``h * w`` patches row by row; under a token budget ``K`` is the budget, NaN after
        the image's patches) into the heaps of ``key``."""
        flat, grids = maps
        m = flat.shape[0]
        self._merge_heaps(key, channels, {"scores": scores, "indices": indices},
                          {"scores": scores[:m], "indices": indices[:m], "maps": flat, "grids": grids})

    def _merge_heaps(self, key: str, channels: list[int], top: dict[str, torch.Tensor],
                     mapped: dict[str, torch.Tensor]) -> None:
        """Merge candidate heaps into those of ``key``: ``top`` (scores and indices ``[C, n]`` of every kept
        channel) and ``mapped`` (scores, indices, maps and grids of the first ``M`` channels, over candidates of
        their own)."""
        if key in self.top:
            held = self.mapped[key]
            if held["maps"].shape[-1] != mapped["maps"].shape[-1] or self.channels[key] != channels:
                raise VitscopeValueError(f"{self.name}: '{key}' changed grid or channels between batches; "
                                         "use one input size per run, or keep each image's aspect ratio "
                                         "(--keep-aspect) for grids of their own")
            top = {name: torch.cat([self.top[key][name].to(value.device), value], dim=1) for name, value in top.items()}
            mapped = {name: torch.cat([held[name].to(value.device), value], dim=1) for name, value in mapped.items()}
        # total order: score descending, then dataset index ascending
        self.top[key] = merge_topk(top, self._cfg_k, key="scores", tie="indices", dim=1)
        self.mapped[key] = merge_topk(mapped, self._cfg_k, key="scores", tie="indices", dim=1)
        self.channels[key] = list(channels)

    def _forget_snapshots(self) -> None:
        """Drop the pruning bookkeeping (not state): snapshots taken before a merge, load or reset would prune images
        those brought in."""
        for key in ("_snapshots", "_added", "_seq"):
            self.__dict__.pop(key, None)

    def merge(self, other: Analysis) -> Analysis:
        self._forget_snapshots()
        return super().merge(other)

    def load_state_dict(self, state: Mapping[str, Any], copy: bool = True) -> None:
        self._forget_snapshots()
        super().load_state_dict(state, copy)

    def reset(self) -> None:
        self._forget_snapshots()
        super().reset()

    def fresh(self) -> Analysis:
        twin = super().fresh()
        twin._forget_snapshots()
        return twin

    def _kept_indices(self) -> set[int]:
        """The images of every heap (host reads: for :meth:`compute`)."""
        return {int(i) for t in self.top.values() for i in t["indices"].flatten().tolist()}

    def _shown_indices(self) -> set[int]:
        """The images the figures show: the top-k of the first :data:`SHOWN_UNITS` mapped units of each site."""
        return {int(i) for held in self.mapped.values() for i in held["indices"][:SHOWN_UNITS].flatten().tolist()}

    def _keep_candidates(self, batch: Batch) -> None:
        """Keep the path and a small picture of every image of the batch, and forget those of images that a
        finished snapshot of the heaps shows out of them (an image out of a local top-k cannot come back, nor be
        in the merged one). The snapshot is a host copy of the heaps' indices, read once it has arrived, so the
        host never waits for the device: one batch late on a GPU, and :meth:`compute` filters exactly."""
        seq = self.__dict__.get("_seq", 0) + 1
        self.__dict__["_seq"] = seq
        added = self.__dict__.setdefault("_added", {})  # dataset index -> sequence number of its batch
        self.paths.update({int(i): _spelt(str(p)) for i, p in zip(batch.indices, batch.paths)})
        added.update({int(i): seq for i in batch.indices})
        if batch.pixels is not None:
            new = [j for j, i in enumerate(batch.indices) if int(i) not in self.pictures]
            for j, picture in zip(new, _pictures(batch, new)):
                self.pictures[int(batch.indices[j])] = picture
        snapshots = self.__dict__.setdefault("_snapshots", LaggedSnapshot())
        done = snapshots.latest()
        if done is not None:
            taken, (kept, shown) = done
            kept, shown = set(kept.tolist()), set(shown.tolist())

            def stays(i: int, wanted: set[int]) -> bool:
                return i in wanted or added.get(i, 0) > taken

            self.paths = {i: p for i, p in self.paths.items() if stays(i, kept)}
            self.pictures = {i: p for i, p in self.pictures.items() if stays(i, shown)}
            self.__dict__["_added"] = {i: n for i, n in added.items() if i in self.paths or i in self.pictures}
        snapshots.take(seq, torch.cat([t["indices"].flatten() for t in self.top.values()]),
                       torch.cat([held["indices"][:SHOWN_UNITS].flatten() for held in self.mapped.values()]))

    def compute(self) -> Result:
        keys = sorted(self.top, key=natural_key)
        tensors: dict[str, torch.Tensor] = {}
        for key in keys:
            for field in ("scores", "indices"):
                tensors[f"{key}.{field}"] = self.top[key][field].clone()
            tensors.update(_maps_of(key, self.mapped[key]))
        shown = sorted(self._shown_indices() & set(self.pictures))
        if shown:
            tensors["pictures"] = torch.stack([self.pictures[i] for i in shown])
        meta = {"num_images": self.num_images, "k": self._cfg_k, "hooks": keys, "picture_indices": shown,
                "channels": {k: list(self.channels[k]) for k in keys},
                "mapped": {k: list(self.channels[k][: self.mapped[k]["maps"].shape[0]]) for k in keys},
                "paths": {str(i): self.paths[i] for i in sorted(self._kept_indices() & set(self.paths))}}
        return TopActivationsResult(name=self.name, tensors=tensors, meta=meta)


def _spelt(path: str) -> str:
    """A file's path spelt from the root (a relative one would mean another file once a run resumes from another
    working folder); a name that is no file (a shard's member, an image in memory) as it is."""
    return path if os.path.isabs(path) or not os.path.exists(path) else os.path.abspath(path)

