"""``FeatureRows``: the feature cache as one more consumer of the engine's pass (no loop of its own).

For every request it pools the recorded tokens of each batch (:func:`~vitscope.cache.request.pool_group`) and
appends the rows, with their image positions, to a disk-backed :class:`~vitscope.cache.rowstore.RowStore`
(declared ``"cat"`` state: merging and resuming come with it). Mask pooling reads the source's region masks
(``targets["regions"]``, which the engine loads when an analysis requires them) and projects them through the
view into the token frame.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitscope.analyses.base import Analysis, Batch
from vitscope.cache.request import FeatureRequest, pool_group
from vitscope.cache.rowstore import RowStore
from vitscope.errors import VitscopeValueError
from vitscope.functional.pooling import mask_weights
from vitscope.models.spec import ModelSpec
from vitscope.models.views import TokenGroup, View

__all__ = ["FeatureRows"]


def _keep_first(mine: dict, theirs: dict) -> dict:
    return mine or dict(theirs)


class FeatureRows(Analysis):
    """Rows of pooled per-block features for each request, streamed to disk.

    Args:
        requests: what to pool (one row store each).
        view: the view the pass runs (masks follow its geometry).
        workdir: folder of the spilled rows.
    """

    name = "feature_rows"

    def __init__(self, requests: Sequence[FeatureRequest], view: View, workdir: str | Path | None = None) -> None:
        super().__init__()
        self._cfg_requests, self._cfg_view = list(requests), view
        self.required_targets = ("regions",) if any(r.pooling == "mask" for r in self._cfg_requests) else ()
        for k in range(len(self._cfg_requests)):
            self.add_state(f"rows{k}", functools.partial(RowStore, workdir=workdir), reduce="cat")
        self.add_state("layout", {}, reduce=_keep_first)  # grid, frame and prefix of the first image

    def store(self, k: int) -> RowStore:
        """The rows of request ``k``."""
        return getattr(self, f"rows{k}")

    def required_hooks(self, spec: ModelSpec) -> list[str]:
        return list(dict.fromkeys(h for r in self._cfg_requests for h in r.hooks(spec.num_blocks)))

    def update(self, record: Mapping[str, torch.Tensor], batch: Batch) -> None:
        spec = batch.spec
        frame_hw = tuple(batch.pixels.shape[-2:]) if batch.pixels is not None else tuple(
            int(g) * spec.patch_size for g in batch.grid)
        group = TokenGroup(list(range(batch.size)), {k: v.float() for k, v in record.items()},
                           spec.num_prefix_tokens, tuple(batch.grid), frame_hw)
        if not self.layout:
            self.layout = {"grid": list(group.grid), "frame_hw": list(group.frame_hw), "num_prefix": group.num_prefix}
        index = np.asarray(batch.indices, dtype=np.int64)
        weights, labels, region = self._regions(batch, group.grid) if self.required_targets else (None, None, None)
        for k, r in enumerate(self._cfg_requests):
            blocks = r.block_list(spec.num_blocks)
            cols: dict[str, Any] = {f"block{i}": pool_group(group, f"blocks.{i}.{r.site}", r.pooling, weights)
                                    .float() for i in blocks}  # copied to the host by the store, unwaited
            if r.pooling == "mask":
                cols["index"] = np.repeat(index, [len(w) for w in weights])
                cols["label"] = np.concatenate(labels) if labels else np.zeros(0, dtype=np.int64)
                cols["region"] = np.concatenate(region).astype(np.int64) if region else np.zeros(0, dtype=np.int64)
            else:
                cols["index"] = index
            self.store(k).append(cols)

    def _regions(self, batch: Batch, grid: tuple[int, int]) -> tuple[list, list, list]:
        """Per image: token weights of its regions in the view's frame, their labels, their mask numbers."""
        weights, labels, region = [], [], []
        for regions in batch.targets.get("regions", [None] * batch.size):
            if regions is None:
                raise VitscopeValueError("mask pooling: this data has no region masks; use a dataset with instance "
                                         "masks (--data ROOT::coco or ::partimagenet)")
            masks, mask_labels = regions
            w = mask_weights(self._cfg_view.mask_frame(masks, batch.spec), grid)
            keep = w.sum(dim=1) > 0  # a region cropped away covers no token: no row
            weights.append(w[keep])
            labels.append(np.asarray(mask_labels)[keep.numpy()])
            region.append(np.flatnonzero(keep.numpy()))
        return weights, labels, region

    def compute(self) -> dict[str, Any]:
        return {"rows": [len(self.store(k)) for k in range(len(self._cfg_requests))], "layout": dict(self.layout)}
