"""Shared plumbing of the attention-suite accumulators: block discovery, geometry, plan, random baseline."""

from __future__ import annotations

import fnmatch
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from vitscope.analyses.base import Analysis, Batch, thumbnails
from vitscope.analyses.batch import ATTENTION_BLOCKS
from vitscope.analyses.grids import by_images, grid_key, grid_of
from vitscope.analyses.state import first_seen
from vitscope.errors import VitscopeValueError
from vitscope.functional.attention_blocks import BlockStats, random_block_statistics
from vitscope.hooks.names import split_block_name
from vitscope.models.spec import ModelSpec

__all__ = ["PATTERN_HOOKS", "AttentionAccumulator", "AttentionGeometry", "grid_key", "grid_of", "has_cls_token"]

PATTERN_HOOKS = "blocks.*.attn.pattern"
RANDOM_KINDS: tuple[str, ...] = ("uniform", "gaussian")


def has_cls_token(spec: ModelSpec) -> bool:
    """True when the model's first token is a CLS token (not for SigLIP-like models): the spec's ``has_cls_token``."""
    return spec.has_cls_token


@dataclass(frozen=True)
class AttentionGeometry:
    """What must agree between batches (and between merged accumulators) of an attention analysis. The token grid
    may differ from batch to batch (images that keep their aspect ratio): each batch's is ``batch.grid``, and
    the accumulator counts the images of every grid (its ``grids`` state)."""

    blocks: tuple[int, ...]
    num_heads: int
    num_prefix: int
    has_cls: bool

    def describe(self) -> dict:
        return {"blocks": list(self.blocks), "num_heads": self.num_heads, "num_prefix": self.num_prefix}


class AttentionAccumulator(Analysis):
    """Base of the attention suite: reads every ``blocks.{i}.attn.pattern`` through the shared pass.

    Subclasses set ``NEEDS`` (per-block quantities of :mod:`~vitscope.functional.attention_blocks`), declare
    their sums in ``_declare_sums`` and implement ``_update_blocks`` and ``compute``. The block statistics are
    a shared quantity of the batch (``"attention_blocks"``): the engine computes them once per batch and block
    with the union of what the run's analyses need.

    Args:
        seed: seed of the random-attention baseline.
        random_samples: random attention patterns drawn per block for the baseline (their mean is reported).
        random_kind: ``"uniform"`` (uniform values, every row rescaled to sum 1) or ``"gaussian"`` (the same
            with half-normal values); docs/methods.md, Random baselines.
    """

    needs_attention = True
    NEEDS: ClassVar[frozenset[str]] = frozenset()
    requires_cls: ClassVar[bool] = False
    required_targets: ClassVar[tuple[str, ...]] = ()

    def __init__(self, seed: int = 0, random_samples: int = 4, random_kind: str = "uniform") -> None:
        super().__init__()
        if random_kind not in RANDOM_KINDS:
            raise VitscopeValueError(f"random_kind must be one of {RANDOM_KINDS}, got {random_kind!r}")
        if int(random_samples) < 1:
            raise VitscopeValueError(f"random_samples must be at least 1, got {random_samples}")
        self._cfg_seed = int(seed)
        self._cfg_random_samples = int(random_samples)
        self._cfg_random_kind = random_kind
        self.add_state("num_images", 0, reduce="sum")
        self.add_state("geometry", None, reduce="same")
        self.add_state("grids", {}, reduce="sum")  # "HxW" -> images seen at that token grid
        self.add_state("model", None, reduce="same")  # spec.name of the model, for figure legends
        self._declare_sums()

    # ------------------------------------------------------------ capability

    def required_hooks(self, spec: ModelSpec) -> list[str]:
        return [PATTERN_HOOKS]

    def record_reads(self, spec: ModelSpec) -> list[str]:
        return []  # patterns are read through the shared block statistics (or update_block), only shapes here

    def why_unsupported(self, spec: ModelSpec) -> str | None:
        """One-line reason this analysis cannot run on ``spec`` (None when it can)."""
        if not spec.is_transformer:
            return f"analysis '{self.name}' needs attention patterns, but {spec.name} is a CNN and has no attention"
        if self.requires_cls and not has_cls_token(spec):
            return (f"analysis '{self.name}' needs a CLS token, but {spec.name} has none "
                    f"(prefix tokens: {list(spec.prefix_kinds) or 'none'}); use spatial_average_maps instead")
        if not self.hooks_exist(spec):
            return f"analysis '{self.name}' needs the hook {PATTERN_HOOKS!r}, which {spec.name} does not provide"
        return None

    # ------------------------------------------------------------ state

    def _declare_sums(self) -> None:
        """Declare the analysis's own sums (``add_state``)."""

    def _adopt(self, geometry: AttentionGeometry, grid: Sequence[int], images: int) -> bool:
        """Accept ``geometry`` (first batch) or check it matches, and count ``images`` at ``grid``; True when the
        sums are still empty."""
        key = grid_key(grid)
        self.grids[key] = self.grids.get(key, 0) + int(images)
        if self.geometry is None:
            self.geometry = geometry
            return True
        if geometry != self.geometry:
            raise VitscopeValueError(
                f"{self.name}: this batch has blocks {list(geometry.blocks)}, {geometry.num_heads} heads and "
                f"{geometry.num_prefix} prefix tokens, but earlier ones had blocks {list(self.geometry.blocks)}, "
                f"{self.geometry.num_heads} heads and {self.geometry.num_prefix} prefix tokens: one model per analysis"
            )
        return False

    # ------------------------------------------------------------ grids

    def grid_counts(self) -> list[tuple[tuple[int, int], int]]:
        """``((h, w), images)`` of every grid seen, most images first (ties: the smaller grid first); the first
        is the run's main grid, whose results carry the plain names."""
        return [(grid_of(k), int(n)) for k, n in by_images(self.grids.items())]

    def main_grid(self) -> tuple[int, int]:
        return self.grid_counts()[0][0]

    def over_grids(self, fn: Callable[[tuple[int, int]], torch.Tensor]) -> torch.Tensor:
        """``fn(grid)`` of one grid, or, over images of several grids, its mean weighted by their images (a
        per-image quantity's dataset mean, e.g. of a random baseline that depends on the grid)."""
        counts = self.grid_counts()
        if len(counts) == 1:
            return fn(counts[0][0])
        total = sum(n for _, n in counts)
        return sum(fn(grid) * (n / total) for grid, n in counts)

    def own_needs(self) -> frozenset[str]:
        """Per-block quantities (:data:`~vitscope.functional.attention_blocks.QUANTITIES`) this analysis reads."""
        return self.NEEDS

    def shared_quantities(self, spec: ModelSpec) -> dict[str, frozenset[str]]:
        needs = self.own_needs()
        return {ATTENTION_BLOCKS: needs if has_cls_token(spec) else needs - {"cls"}}

    # ------------------------------------------------------------ reading a batch

    def _patterns(self, record: Mapping[str, torch.Tensor], batch: Batch) -> tuple[AttentionGeometry, list]:
        """Sorted ``(block, pattern)`` pairs of the record and the batch's geometry (validated)."""
        found = sorted(
            (split_block_name(k)[0], k)
            for k in record
            if fnmatch.fnmatchcase(k, PATTERN_HOOKS) and split_block_name(k) is not None
        )
        if not found:
            raise VitscopeValueError(
                f"{self.name}: the record holds no 'blocks.{{i}}.attn.pattern'; record {PATTERN_HOOKS!r} "
                "(required_hooks) on a transformer"
            )
        spec = batch.spec
        grid = (int(batch.grid[0]), int(batch.grid[1]))
        p = int(spec.num_prefix_tokens)
        shape = None
        pairs = []
        for i, key in found:
            pattern = record[key]
            if pattern.dim() != 4 or (shape is not None and pattern.shape != shape):
                raise VitscopeValueError(
                    f"{self.name}: '{key}' has shape {tuple(pattern.shape)}; expected [B, H, N, N] with the same "
                    "shape in every block"
                )
            shape = pattern.shape
            pairs.append((i, pattern))
        if shape[-1] != p + grid[0] * grid[1]:
            raise VitscopeValueError(
                f"{self.name}: the patterns have N = {shape[-1]} tokens, but grid {grid[0]}x{grid[1]} plus "
                f"{p} prefix tokens of {spec.name} makes {p + grid[0] * grid[1]}"
            )
        geometry = AttentionGeometry(tuple(i for i, _ in found), int(shape[1]), p, has_cls_token(spec))
        return geometry, pairs

    def _block_stats(self, record: Mapping[str, torch.Tensor], batch: Batch) -> tuple[AttentionGeometry, list]:
        """Geometry and the shared :class:`BlockStats` of every block (computed once per batch and block)."""
        geometry, pairs = self._patterns(record, batch)
        blocks = batch.quantity(ATTENTION_BLOCKS, record, self.shared_quantities(batch.spec)[ATTENTION_BLOCKS])
        return geometry, [blocks[i] for i, _ in pairs]

    def update(self, record: Mapping[str, torch.Tensor], batch: Batch) -> None:
        """Add one batch: reads every ``blocks.{i}.attn.pattern`` ``[B, H, N, N]`` in the record."""
        geometry, stats = self._block_stats(record, batch)
        if stats[0].batch_size == 0:
            return
        self._adopt(geometry, batch.grid, stats[0].batch_size)
        self.model = self.model or batch.spec.name
        self._update_blocks(geometry, stats, batch)

    @abstractmethod
    def _update_blocks(self, geometry: AttentionGeometry, stats: list[BlockStats], batch: Batch) -> None:
        """Add one batch's per-block statistics to the sums."""

    # ------------------------------------------------------------ random baseline

    def _random(self, grid: Sequence[int] | None = None) -> tuple[BlockStats, ...]:
        """Random-baseline statistics of every block at ``grid`` (default: the main grid; cached per run)."""
        g = self.geometry
        grid = tuple(grid) if grid is not None else self.main_grid()
        return random_block_statistics(self._cfg_seed, self._cfg_random_kind, self._cfg_random_samples,
                                       len(g.blocks), g.num_heads, grid, g.num_prefix)

    def _base_meta(self) -> dict:
        random = {"seed": self._cfg_seed, "kind": self._cfg_random_kind, "samples": self._cfg_random_samples}
        meta = {"num_images": self.num_images, "model": self.model, "random": random}
        if self.geometry is not None:
            meta.update(self.geometry.describe())
        if self.grids:
            meta["grid"] = list(self.main_grid())
            meta["grids"] = {grid_key(g): n for g, n in self.grid_counts()}
        return meta


def image_name(path: str) -> str:
    """How an image is named in titles: its file name (``skimage:astronaut`` stays as it is)."""
    text = str(path)
    return text.rsplit("/", 1)[-1] if "/" in text else text


class ChosenImages:
    """Mixin keeping the maps and thumbnails of the images chosen by dataset index (``_cfg_images``).

    The host defines ``_cfg_images`` (a frozenset of dataset indices) and calls :meth:`_declare_chosen` from
    its ``_declare_sums``. The first occurrence of an index wins, in updates and merges alike.
    """

    _cfg_images: frozenset[int]

    def _declare_chosen(self) -> None:
        self.add_state("image_maps", {}, reduce=first_seen)
        self.add_state("image_pixels", {}, reduce=first_seen)
        self.add_state("image_names", {}, reduce=first_seen)  # file names, for titles and the explorer

    def _keep_chosen(self, batch: Batch, maps: torch.Tensor) -> None:
        """Store ``maps[j]`` (float64, on the batch's device until the pass ends) and the thumbnail of every
        chosen image of the batch."""
        chosen = [j for j, idx in enumerate(batch.indices) if int(idx) in self._cfg_images]
        for j, pixels in zip(chosen, thumbnails(batch, chosen)):
            idx = int(batch.indices[j])
            self.image_maps.setdefault(idx, maps[j].to(torch.float64))
            self.image_pixels.setdefault(idx, pixels)
            self.image_names.setdefault(idx, image_name(batch.paths[j]) if j < len(batch.paths) else f"image {idx}")

    def _chosen_names(self, indices: Sequence[int] | None = None) -> list[str]:
        """The chosen images' names (file names), in increasing index order (default: every chosen image)."""
        return [self.image_names.get(i, f"image {i}") for i in (sorted(self.image_maps) if indices is None
                                                               else indices)]

    def _chosen_tensors(self, indices: Sequence[int] | None = None, suffix: str = "") -> dict[str, torch.Tensor]:
        """``image_maps`` ``[I, ...]`` and ``images`` ``[I, H, W, 3]`` of ``indices`` (default: every chosen image)
        in increasing index order, named with ``suffix`` (empty if none)."""
        order = sorted(self.image_maps) if indices is None else list(indices)
        if not order:
            return {}
        return {f"image_maps{suffix}": torch.stack([self.image_maps[i] for i in order]),
                f"images{suffix}": torch.stack([self.image_pixels[i] for i in order])}

    def _chosen_by_grid(self, main: tuple[int, int]) -> tuple[dict, dict[str, torch.Tensor]]:
        """Meta and tensors of the chosen images: those on the ``main`` grid as ``image_indices`` /
        ``image_names`` / ``image_maps`` / ``images``, the others per grid (``other_grids[HxW]`` in meta,
        tensors named ``...@HxW``): maps of different grids are not one tensor."""
        groups: dict[tuple[int, int], list[int]] = {}
        for i in sorted(self.image_maps):
            groups.setdefault(tuple(int(v) for v in self.image_maps[i].shape[-2:]), []).append(i)
        on_main = groups.pop(tuple(main), [])
        meta: dict = {"image_indices": on_main, "image_names": self._chosen_names(on_main)}
        tensors = self._chosen_tensors(on_main)
        for grid, indices in sorted(groups.items()):
            key = grid_key(grid)
            meta.setdefault("other_grids", {})[key] = {"image_indices": indices,
                                                      "image_names": self._chosen_names(indices)}
            tensors.update(self._chosen_tensors(indices, f"@{key}"))
        return meta, tensors
