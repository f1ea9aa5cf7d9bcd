"""Base of the streaming analyses that need every labelled example at once (clustering, k-NN, linear probe).

Rows (one per image, or one per region mask at the object / part level) go to a disk-backed
:class:`~vitscope.cache.rowstore.RowStore` with their dataset index and label; ``compute`` reads them
back sorted by index, so a merged accumulator scores exactly what one accumulator over all images would.
Labels come from ``batch.targets`` (``label`` per image; for regions the ``regions`` the engine loads from the
source, ``(masks, labels)`` per image, or else ``masks`` and ``instance_labels``, as
:class:`vitscope.data.annotated_source.AnnotatedSource` with ``regions=True`` provides). Data these analyses
cannot score (no labels, one class, one image per class, no train/test split, regions of one class) is refused
before the pass (:meth:`LabelledFeatures.why_unsupported_data`, messages of :mod:`vitscope.analyses.data_checks`);
rows that turn out so anyway (unlabelled batches, unreadable images skipped) give a warning and an empty result
with the reason in ``meta["error"]``.
"""

from __future__ import annotations

import fnmatch
import functools
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch

from vitscope.analyses.attention.base import RANDOM_KINDS, has_cls_token
from vitscope.analyses.base import Analysis, Batch
from vitscope.analyses.data_checks import DataFacts, class_problem, no_labels, no_regions, region_problem
from vitscope.analyses.probes.result import ProbeResult
from vitscope.cache.rowstore import RowStore
from vitscope.errors import VitscopeValueError, VitscopeWarning
from vitscope.functional.index_hash import index_hash
from vitscope.functional.pooling import mask_pool, mask_weights
from vitscope.hooks.names import split_block_name
from vitscope.models.spec import ModelSpec
from vitscope.models.views import StandardView

if TYPE_CHECKING:  # the cache imports the analyses package lazily; annotations only
    from vitscope.cache.feature_cache import CacheEntry

__all__ = ["LabelledFeatures", "UnscoredProbeWarning", "cached_labelled_pair", "check_random_kind", "holdout_mask"]

LEVELS = ("image", "object", "part")
#: the per-batch scratch key of the examples chosen for rows (no hook has this name)
_CHOSEN = "(chosen examples)"


def holdout_mask(indices: np.ndarray, test_fraction: float, seed: int = 0) -> np.ndarray:
    """Deterministic test split by dataset index: ``True`` where an image is held out for testing.

    A splitmix64 hash of ``(seed, index)`` mapped to [0, 1) is compared with ``test_fraction``, so the split
    of an image never depends on which other images are present (merge-exact) and the same seed gives the
    same split. Any integer seed works: it is taken modulo 2**64 (``-1`` splits as ``2**64 - 1``).

    Args:
        indices: ``[n]`` dataset indices (non-negative integers).
        test_fraction: share of images held out, in (0, 1).
        seed: the split's seed.

    Returns:
        ``[n]`` bool.
    """
    return (index_hash(indices, seed) >> np.uint64(11)).astype(np.float64) / float(1 << 53) < test_fraction


def check_random_kind(random_kind: str | None) -> str | None:
    """``random_kind`` if it names a random baseline (``"uniform"``, ``"gaussian"``, or None for none).

    Raises:
        VitscopeValueError: anything else, when the probe is configured rather than after the pass.
    """
    if random_kind is not None and random_kind not in RANDOM_KINDS:
        raise VitscopeValueError(f"random_kind must be {' or '.join(map(repr, RANDOM_KINDS))}, or none for no random "
                                 f"baseline, got {random_kind!r}")
    return random_kind


#: image-level poolings of the probes ("auto": the CLS token where the model has one, else the spatial mean)
TOKENS = ("auto", "cls", "spatial_mean")


class UnscoredProbeWarning(UserWarning):
    """A probe whose rows cannot be scored (too few classes, images or regions): its result holds the reason."""


class LabelledFeatures(Analysis):
    """Keeps pooled block features and labels of every example (image or region) for a final computation.

    Args:
        site: block site (default the block output ``resid_post``).
        tokens: ``"auto"`` (the CLS token where the model has one, else the mean of the spatial tokens: I-JEPA,
            AIMv2, SigLIP), ``"cls"`` or ``"spatial_mean"`` (image level; ignored for regions, which pool spatial
            tokens). The result's ``meta["tokens"]`` says which ran.
        level: ``"image"`` (labels = image labels), ``"object"`` or ``"part"`` (one row per region mask).
        workdir: folder for spilled rows (default: a temporary folder).
    """

    task = "features"
    required_targets: ClassVar[tuple[str, ...]] = ("label",)  # default configuration: image labels
    needs_transformer = True  # blocks of tokens
    requires_cls = False  # default "auto": the CLS token where there is one, else the spatial mean

    def __init__(self, site: str = "resid_post", tokens: str = "auto", level: str = "image",
                 workdir: str | Path | None = None) -> None:
        super().__init__()
        if tokens not in TOKENS:
            raise VitscopeValueError(f"tokens must be one of {', '.join(TOKENS)}, got {tokens!r}")
        if level not in LEVELS:
            raise VitscopeValueError(f"level must be one of {LEVELS}, got {level!r}")
        self._cfg_site, self._cfg_tokens, self._cfg_level, self._cfg_workdir = site, tokens, level, workdir
        if level != "image":  # the engine loads the source's region masks and labels for analyses that require them
            self.required_targets = ("regions",)
        self.add_state("store", functools.partial(RowStore, workdir=workdir), reduce="cat")  # rows, on disk
        self.add_state("blocks", [], reduce="same")
        self.add_state("unlabelled", 0, reduce="sum")  # images without the ground truth this analysis needs
        self.add_state("model", "", reduce="same")
        self.add_state("tokens_used", "", reduce="same")  # what "auto" became for this model

    def tokens_for(self, spec: ModelSpec) -> str:
        """The image-level pooling on ``spec``: ``tokens``, with ``"auto"`` resolved from the model's prefix."""
        if self._cfg_tokens != "auto":
            return self._cfg_tokens
        return "cls" if has_cls_token(spec) else "spatial_mean"

    def required_hooks(self, spec: ModelSpec) -> list[str]:
        return [f"blocks.*.{self._cfg_site}"]

    def why_unsupported(self, spec: ModelSpec) -> str | None:
        """One-line reason this analysis cannot run on ``spec`` (None when it can)."""
        if not spec.is_transformer:
            return f"analysis '{self.name}' reads transformer blocks; {spec.name} is a CNN"
        if self._cfg_level == "image" and self._cfg_tokens == "cls" and spec.num_prefix_tokens < 1:
            return (f"analysis '{self.name}' reads the CLS token (tokens='cls'), but {spec.name} has no prefix "
                    "tokens (tiled features drop them); use tokens='spatial_mean'")
        return None

    def _missing_message(self) -> str:
        """Why no image could be scored (the result's error)."""
        return no_labels("the data") if self._cfg_level == "image" else no_regions(self.name, self._cfg_level)

    def _left_out_message(self) -> str:
        """Said once, at the first image without ground truth: the others are still scored."""
        what = "a class label" if self._cfg_level == "image" else f"{self._cfg_level} region masks"
        return (f"{self.name}: images without {what} are left out of the probe (their count is the result's "
                "unlabelled_images)")

    def why_unsupported_data(self, data: DataFacts) -> str | None:
        """No labels, one class, one image per class, no train/test split (image level); no region masks or
        regions of one class (object and part levels): the messages of :mod:`vitscope.analyses.data_checks`."""
        if self._cfg_level != "image":
            if not ({"masks", "instance_labels"} <= data.targets or data.has_regions):
                return no_regions(self.name, self._cfg_level)
            return data.region_problem()
        problem = data.class_problem()
        if problem or data.labels is None:
            return problem
        return self.split_problem(np.flatnonzero(data.labels >= 0))

    def split_problem(self, index: np.ndarray) -> str | None:
        """Why the held-out split of the images at dataset positions ``index`` cannot be scored (None: it can, or
        this analysis holds nothing out)."""
        return None

    def rows_problem(self, index: np.ndarray, labels: np.ndarray) -> str | None:
        """:meth:`why_unsupported_data` of the rows kept (``index``, ``label`` ``[n]``): images skipped as unreadable
        or left out by ``limit`` can leave data that the check before the pass let through."""
        if self._cfg_level != "image":
            return region_problem(labels.size, np.unique(labels).size)
        return class_problem(labels) or self.split_problem(np.unique(index))

    def refused(self, problem: str, metrics: Sequence[str]) -> ProbeResult:
        """The result of rows that cannot be scored: no tensors, the reason in ``meta["error"]`` (and a warning)."""
        warnings.warn(f"{self.name}: {problem}", UnscoredProbeWarning, stacklevel=3)
        return ProbeResult(self.name, {}, {**self.base_meta(), "metrics": list(metrics), "error": problem})

    def stream_hooks(self, spec: ModelSpec) -> list[str]:
        """Every block is pooled to its rows as the model makes it: one block's tokens are alive at a time."""
        return [f"blocks.*.{self._cfg_site}"]

    def reduce_hook(self, name: str, tensor: torch.Tensor, batch: Batch) -> torch.Tensor | None:
        """``[n, D]`` float32 rows of one block ``[B, N, D]`` for the batch's examples with ground truth (None when
        none has any)."""
        chosen = self._chosen(batch)
        return None if chosen is None else self._pool(tensor, batch, chosen)

    def update(self, record: Mapping[str, torch.Tensor], batch: Batch) -> None:
        """Add one batch: the site of every block ``[B, N, D]`` plus the labels (or masks) in ``batch.targets``."""
        found = sorted((split_block_name(k)[0], k) for k in record
                       if fnmatch.fnmatchcase(k, f"blocks.*.{self._cfg_site}") and split_block_name(k))
        if not found:
            raise VitscopeValueError(
                f"{self.name}: the record holds no 'blocks.*.{self._cfg_site}'; record required_hooks(spec)")
        if self.blocks and [i for i, _ in found] != self.blocks:
            raise VitscopeValueError(f"{self.name}: blocks {[i for i, _ in found]} differ from those seen before "
                                     f"{self.blocks}")
        chosen = self._chosen(batch)
        missing = batch.size - (0 if chosen is None else len(chosen["have"]))
        if missing:
            if self.unlabelled == 0:
                warnings.warn(self._left_out_message(), VitscopeWarning, stacklevel=2)
            self.unlabelled += missing
        if chosen is None:
            return
        rows = {f"block{i}": self.reduced(k, record, batch) for i, k in found}
        self.blocks, self.model = [i for i, _ in found], batch.spec.name
        self.store.append({**rows, "index": chosen["index"], "label": chosen["label"], "region": chosen["region"]})

    def _chosen(self, batch: Batch) -> dict | None:
        """The batch's examples with ground truth and how each is pooled (once per batch; None when no image has
        any). Each image counts alone, so the rows do not depend on how images were batched."""
        scratch = self.per_batch(batch)
        if _CHOSEN not in scratch:
            scratch[_CHOSEN] = self._images(batch) if self._cfg_level == "image" else self._regions(batch)
        return scratch[_CHOSEN]

    def _images(self, batch: Batch) -> dict | None:
        labels = batch.targets.get("label")
        if labels is None or len(labels) != batch.size:
            return None
        have = [j for j, v in enumerate(labels) if v is not None]
        if not have:
            return None
        cls = self.tokens_for(batch.spec) == "cls"
        self.tokens_used = "cls" if cls else "spatial_mean"
        if cls and batch.spec.num_prefix_tokens < 1:  # token 0 would be a spatial token: refuse, not score it
            raise VitscopeValueError(self.why_unsupported(batch.spec))
        return {"have": have, "select": torch.as_tensor(have, dtype=torch.long), "cls": cls,
                "index": np.asarray(batch.indices, dtype=np.int64)[have],
                "label": np.asarray([labels[j] for j in have], dtype=np.int64),
                "region": np.zeros(len(have), dtype=np.int64)}

    def _regions(self, batch: Batch) -> dict | None:
        regions = batch.targets.get("regions")
        if regions is not None and len(regions) == batch.size:  # the engine's: (masks, labels) or None per image
            masks = [None if r is None else r[0] for r in regions]
            mask_labels = [None if r is None else r[1] for r in regions]
        else:
            masks, mask_labels = batch.targets.get("masks"), batch.targets.get("instance_labels")
        if masks is None or mask_labels is None or len(masks) != batch.size or len(mask_labels) != batch.size:
            return None
        have = [j for j in range(batch.size) if masks[j] is not None and mask_labels[j] is not None]
        if not have:
            return None
        weights = {j: mask_weights(StandardView().mask_frame(np.asarray(masks[j]), batch.spec), batch.grid)
                   for j in have}
        keep = {j: w.sum(dim=1) > 0 for j, w in weights.items()}  # regions cropped away cover no token
        kept = {j: keep[j].numpy() for j in have}
        return {"have": have, "weights": {j: weights[j][keep[j]] for j in have},
                "index": np.concatenate([np.full(int(kept[j].sum()), batch.indices[j]) for j in have]).astype(np.int64),
                "label": np.concatenate([np.asarray(mask_labels[j])[kept[j]] for j in have]).astype(np.int64),
                "region": np.concatenate([np.flatnonzero(kept[j]) for j in have]).astype(np.int64)}

    @staticmethod
    def _pool(tokens: torch.Tensor, batch: Batch, chosen: dict) -> torch.Tensor:
        """``[n, D]`` float32 rows of one block's ``[B, N, D]`` tokens: the chosen token or mean per image, or the
        mask-weighted mean per region."""
        p = batch.spec.num_prefix_tokens
        if "weights" not in chosen:
            select = chosen["select"]
            return (tokens[select, 0] if chosen["cls"] else tokens[select, p:].mean(dim=1)).float()
        return torch.cat([mask_pool(tokens[j, p:], chosen["weights"][j].to(tokens.device))
                          for j in chosen["have"]]).float()

    def rows(self) -> tuple[np.ndarray, np.ndarray, dict[int, np.ndarray]]:
        """``(index [n], label [n], {block: features [n, D]})`` sorted by (index, region)."""
        index, region = self.store.column("index"), self.store.column("region")
        order = np.lexsort((region, index))
        feats = {i: self.store.column(f"block{i}")[order] for i in self.blocks}
        return index[order], self.store.column("label")[order], feats

    def base_meta(self) -> dict:
        meta = {"task": self.task, "model": self.model, "site": self._cfg_site,
                "tokens": self.tokens_used or self._cfg_tokens,
                "level": self._cfg_level, "blocks": list(self.blocks), "num_rows": len(self.store),
                "unlabelled_images": self.unlabelled}
        if len(self.store) == 0 and self.unlabelled:
            meta["error"] = self._missing_message()
        return meta


def cached_labelled_pair(train: CacheEntry, train_labels: np.ndarray, test: CacheEntry, test_labels: np.ndarray,
                         blocks: Sequence[int] | None = None) -> tuple:
    """Features and labels of a cached training and test set, unlabelled images (-1) left out.

    Args:
        train, test: feature-cache entries (``CacheEntry``); train_labels, test_labels: ``[n_images]`` labels by
            image position (rows are looked up through each entry's ``index``).
        blocks: blocks to score (default: those both entries hold).

    Returns:
        ``(blocks, features, y_train, y_test, pooling)`` where ``features(b)`` gives the block's
        ``(train [n, d], test [m, d])`` numpy features of the labelled rows.
    """
    ytr, yte = np.asarray(train_labels)[train.index], np.asarray(test_labels)[test.index]
    ktr, kte = ytr >= 0, yte >= 0
    blocks = list(blocks) if blocks is not None else [b for b in train.blocks if b in test.blocks]

    def features(b: int):
        return np.asarray(train.block(b))[ktr], np.asarray(test.block(b))[kte]

    return blocks, features, ytr[ktr], yte[kte], train.meta.get("request", {}).get("pooling", "")
