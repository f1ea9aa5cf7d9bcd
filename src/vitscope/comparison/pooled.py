"""``PooledFeatures``: per-block pooled image features of any model (ViT or CNN), kept for a comparison.

``vitscope compare`` runs each model once over the data; this accumulator keeps, for every image and block,
the pooled block output so that clustering, k-NN and CKA between models are computed afterwards from the
same pass. ViTs: the CLS token (when the model has one) and the mean of the spatial tokens of
``blocks.{i}.resid_post``; CNNs: the spatial mean of every ``stages.{i}`` map (they have no CLS). Rows go
to a disk-backed RowStore with their dataset index and label (-1 when the data has none), so memory stays
bounded and merges are exact (rows are sorted by index when read).
"""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from vitscope.analyses.attention.base import has_cls_token
from vitscope.analyses.base import Analysis, Batch, Result
from vitscope.cache.rowstore import RowStore
from vitscope.errors import VitscopeValueError
from vitscope.models.spec import ModelSpec

__all__ = ["PooledFeatures", "PooledFeaturesResult"]


class PooledFeaturesResult(Result):
    """Features ``cls_{b}`` / ``mean_{b}`` ``[n, D]`` per block, ``index`` and ``label`` ``[n]`` (sorted by index).

    The arrays are inputs of the comparison, not outputs: only the metadata is written.
    """

    DIMS = {"index": ("image",), "label": ("image",), "*": ("image", "channel")}

    def to_frame(self, key: str | None = None):
        """One tensor as a frame (``key``), or the images' indices and labels."""
        if key is not None:
            return super().to_frame(key)
        import pandas as pd

        return pd.DataFrame({"index": self.tensors["index"].numpy(), "label": self.tensors["label"].numpy()}) \
            if "index" in self.tensors else pd.DataFrame()

    def to_json(self) -> dict:
        return dict(self.meta)

    def arrays(self) -> dict:
        return {}


def _block_number(name: str) -> int:
    return int(name.split(".")[1])


class PooledFeatures(Analysis):
    """Keep pooled per-block features of every image (see the module docstring).

    Args:
        workdir: folder for spilled rows (default: a temporary folder).
    """

    name = "pooled_features"

    def __init__(self, workdir: str | Path | None = None) -> None:
        super().__init__()
        self._cfg_workdir = workdir
        self.add_state("store", functools.partial(RowStore, workdir=workdir), reduce="cat")
        self.add_state("blocks", [], reduce="same")
        self.add_state("has_cls", None, reduce="same")
        self.add_state("model", "", reduce="same")

    def required_hooks(self, spec: ModelSpec) -> list[str]:
        return ["blocks.*.resid_post"] if spec.is_transformer else ["stages.*"]

    def update(self, record: Mapping[str, torch.Tensor], batch: Batch) -> None:
        """Add one batch: ``blocks.{i}.resid_post`` ``[B, N, D]`` (CNN: ``stages.{i}`` ``[B, C, h, w]``)."""
        spec = batch.spec
        pattern = self.required_hooks(spec)[0]
        keys = sorted((k for k in record if fnmatch.fnmatchcase(k, pattern)), key=_block_number)
        if not keys:
            raise VitscopeValueError(f"{self.name}: the record holds no '{pattern}'; record required_hooks(spec)")
        self.blocks, self.model = [_block_number(k) for k in keys], spec.name
        self.has_cls = spec.is_transformer and has_cls_token(spec)
        p = spec.num_prefix_tokens
        cols: dict[str, object] = {}
        for k, b in zip(keys, self.blocks):
            x = record[k].float()
            if spec.is_transformer:
                cols[f"mean_{b}"] = x[:, p:].mean(dim=1)
                if self.has_cls:
                    cols[f"cls_{b}"] = x[:, 0]
            else:
                cols[f"mean_{b}"] = x.mean(dim=(2, 3))
        labels = batch.targets.get("label")
        if labels is None or len(labels) != batch.size:
            labels = [None] * batch.size
        cols["label"] = np.asarray([-1 if v is None else v for v in labels], dtype=np.int64)  # per image
        cols["index"] = np.asarray(batch.indices, dtype=np.int64)
        self.store.append(cols)

    def compute(self) -> PooledFeaturesResult:
        meta = {"model": self.model, "blocks": list(self.blocks), "has_cls": bool(self.has_cls),
                "num_rows": len(self.store)}
        if len(self.store) == 0:
            return PooledFeaturesResult(self.name, {}, meta)
        order = np.argsort(self.store.column("index"), kind="stable")
        tensors = {name: torch.from_numpy(np.ascontiguousarray(self.store.column(name)[order]))
                   for name in self.store.schema}
        return PooledFeaturesResult(self.name, tensors, meta)
