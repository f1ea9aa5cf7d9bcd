"""Residual-path analysis (paper 002 appendix D.4, figure 23; docs/methods.md, Representations "Residual analysis").

For every attention and MLP sublayer of every block: CKA between the skip input (``resid_pre`` for the
attention sublayer, ``resid_mid`` for the MLP one) and the branch output added to it (``attn_out``,
``mlp_out``, after LayerScale), and the mean over images of ``||skip||_F / ||branch||_F``. The full
skip x branch CKA matrix (skip of block i against branch of block j) is kept as well.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from vitscope.analyses.base import Analysis, Batch, Figure, Result
from vitscope.analyses.data_checks import DataFacts
from vitscope.analyses.registry import register_analysis
from vitscope.analyses.representation.cka import cka_features, token_choice_reason
from vitscope.analyses.representation.cka_state import (
    check_cka_options,
    hsic_state_cka,
    merge_hsic,
    minibatch_meta,
    new_hsic_state,
    prepared,
    warn_if_sorted_by_class,
)
from vitscope.errors import VitscopeValueError
from vitscope.functional.cka_grams import row_norms
from vitscope.hooks.names import split_block_name
from vitscope.models.spec import ModelSpec

__all__ = ["ResidualCKA", "ResidualResult"]

_SITES = ("resid_pre", "attn_out", "resid_mid", "mlp_out")


class ResidualResult(Result):
    """Result of :class:`ResidualCKA`; ``plot`` draws the curves and the skip x branch heatmaps."""

    DIMS = {"*_matrix": ("skip_block", "branch_block"), "*": ("block",)}

    def figures(self) -> list[Figure]:
        """``<name>`` (CKA and norm ratio per block) and ``<name>_attn_matrix`` / ``<name>_mlp_matrix``."""
        if "attn_cka" not in self.tensors:
            return []
        from vitscope.viz.labels import label

        t, m = self.tensors, self.meta
        what = f"{m.get('model', '')} ({m.get('tokens')} tokens, {m.get('estimator')}, {m.get('num_images')} images)"

        def curves(path: Path) -> list[Path]:
            from vitscope.viz.representation_figures import residual_figure

            return residual_figure(t["attn_cka"], t["mlp_cka"], t["attn_norm_ratio"], t["mlp_norm_ratio"],
                                   f"Residual paths of {what}", path)

        def matrix(part: str):
            def draw(path: Path) -> list[Path]:
                from vitscope.viz.representation_figures import cka_heatmap

                return cka_heatmap(t[f"{part}_cka_matrix"], f"CKA between {label(part)} skip inputs and branch "
                                   f"outputs, {what}", path, m.get("blocks"), m.get("blocks"),
                                   row_title="skip input of block", col_title="branch output of block")
            return draw

        from vitscope.viz.charts import block_head_chart
        from vitscope.viz.ranges import quantity_range

        paper, blocks, cka_range = "paper 002, fig. 23", m.get("blocks"), quantity_range("cka")
        charts = {part: block_head_chart(t[f"{part}_cka_matrix"], "CKA", blocks, f"CKA between {label(part)} skip "
                                         "inputs and branch outputs", x_label="branch output of block",
                                         y_label="skip input of block", column_labels=blocks, value_range=cka_range)
                  for part in ("attn", "mlp")}
        from vitscope.viz.charts import Chart, LinePanel, curve, tick_names

        ticks = tick_names(len(t["attn_cka"]), blocks)
        lines = Chart([
            LinePanel("block", "CKA (skip, branch)", ticks, [curve("attention", t["attn_cka"], "attention"),
                                                             curve("MLP", t["mlp_cka"], "MLP")],
                      "CKA between the skip path and the branch", cka_range),
            LinePanel("block", "norm ratio (skip / branch)", ticks,
                      [curve("attention", t["attn_norm_ratio"], "attention"), curve("MLP", t["mlp_norm_ratio"], "MLP")],
                      "Norm of the skip over the norm of the branch", log_toggle=True)])
        return [self.figure("", curves, "CKA between the skip path and the attention / MLP branches per block, and "
                            "their norm ratio.", paper, title=f"Residual paths of {what}", chart=lines)] + [
            self.figure(f"_{part}_matrix", matrix(part), f"CKA between every {label(part)} skip input (rows) and "
                        f"every {label(part)} branch output (columns); point at a cell for its value.", paper,
                        chart=charts[part]) for part in ("attn", "mlp")]


@register_analysis("residual_cka", groups=("representation",), order=110)
class ResidualCKA(Analysis):
    """CKA and norm ratio between the skip and the branch of every sublayer (transformers only).

    Args:
        tokens: features per image: ``"all"`` (default), ``"cls"``, ``"spatial"``, ``"spatial_mean"``; the
            norm ratio uses the same selection.
        estimator: ``"minibatch"`` (default), ``"full"`` or ``"full_unbiased"`` (see :class:`BlockCKA`).
        batch: minibatch size; gram_minmax: the 002 code's Gram rescaling.
        workdir: folder for spilled features.
        order, seed: the minibatch estimator's minibatches, ``"dataset"`` (default) or ``"shuffled"`` (see
            :class:`BlockCKA`: on data sorted by class, dataset-order minibatches give a within-class CKA).

    Memory: as :class:`BlockCKA` (minibatches by dataset index, waiting rows on disk), with ``4 L``
    representations (skips and branches) instead of ``L``.

    Result tensors: ``attn_cka``, ``mlp_cka`` ``[L]`` (skip vs branch of the same sublayer),
    ``attn_cka_matrix``, ``mlp_cka_matrix`` ``[L, L]`` (row = skip input of block i, column = branch output of
    block j), ``attn_norm_ratio``, ``mlp_norm_ratio`` ``[L]`` (mean over images; inf where a branch is 0).
    """

    description = ("Residual analysis: CKA between the skip input and each attention / MLP branch output, and the "
                   "norm ratio skip / branch. High CKA and ratio mean the branch changes little.")
    summary = "CKA of skip and branch per sublayer"
    needs_transformer = True  # skip and branch of the attention and MLP sublayers

    def __init__(self, tokens: str = "all", estimator: str = "minibatch", batch: int = 64, gram_minmax: bool = False,
                 workdir: str | Path | None = None, order: str = "dataset", seed: int = 0) -> None:
        super().__init__()
        check_cka_options(tokens, estimator, batch, order)
        self._cfg_tokens, self._cfg_estimator, self._cfg_batch = tokens, estimator, int(batch)
        self._cfg_minmax, self._cfg_workdir = bool(gram_minmax), workdir
        self._cfg_order, self._cfg_seed = order, int(seed)
        self._sorted_data = False  # dataset-order minibatches warned of before the pass (why_unsupported_data)
        self.add_state("state", functools.partial(new_hsic_state, estimator, int(batch), bool(gram_minmax), False,
                                                  workdir, order, int(seed)), reduce=merge_hsic)
        self.add_state("ratio_sum", None, reduce="sum")  # [2, L] sums over images of ||skip|| / ||branch||
        self.add_state("blocks", [], reduce="same")
        self.add_state("model", "", reduce="same")

    def required_hooks(self, spec: ModelSpec) -> list[str]:
        return [f"blocks.*.{s}" for s in _SITES]

    def why_unsupported(self, spec: ModelSpec) -> str | None:
        return token_choice_reason(self.name, self._cfg_tokens, spec)

    def why_unsupported_data(self, data: DataFacts) -> str | None:
        if warn_if_sorted_by_class(self.name, data, self._cfg_estimator, self._cfg_order, self._cfg_batch):
            self._sorted_data = True  # results.json says so too (configuration: fresh copies keep it)
        return super().why_unsupported_data(data)

    def stream_hooks(self, spec: ModelSpec) -> list[str]:
        return self.required_hooks(spec)

    def reduce_hook(self, name: str, tensor: torch.Tensor, batch: Batch) -> tuple[Any, torch.Tensor]:
        """One site of one block: what the HSIC state needs of its CKA features (:func:`prepared`) and the
        features' row norms ``[B]``."""
        x = cka_features(tensor, batch.spec, self._cfg_tokens, name)
        return prepared(self.state, batch.indices, x), row_norms(x)

    def update(self, record: Mapping[str, torch.Tensor], batch: Batch) -> None:
        """Add one batch: ``resid_pre``, ``attn_out``, ``resid_mid``, ``mlp_out`` of every block, ``[B, N, D]``."""
        blocks = sorted({split_block_name(k)[0] for k in record if split_block_name(k) and
                         split_block_name(k)[1] in _SITES})
        missing = [f"blocks.{i}.{s}" for i in blocks for s in _SITES if f"blocks.{i}.{s}" not in record]
        if not blocks or missing:
            raise VitscopeValueError(f"residual_cka: the record lacks {missing[:4] or list(_SITES)}; record "
                                     "required_hooks(spec) on a transformer")
        if self.blocks and blocks != self.blocks:
            raise VitscopeValueError(f"residual_cka: blocks {blocks} differ from the blocks seen before {self.blocks}")
        if batch.size == 0:
            return
        def feats(site: str) -> list[tuple[Any, torch.Tensor]]:
            return [self.reduced(f"blocks.{i}.{site}", record, batch) for i in blocks]

        skip_parts = feats("resid_pre") + feats("resid_mid")
        branch_parts = feats("attn_out") + feats("mlp_out")
        skips, branches = [s for s, _ in skip_parts], [b for b, _ in branch_parts]
        ratios = torch.stack([s / b for (_, s), (_, b) in zip(skip_parts, branch_parts)])
        ratio_sum = ratios.sum(dim=1).reshape(2, len(blocks))
        self.ratio_sum = ratio_sum if self.ratio_sum is None else self.ratio_sum.to(ratio_sum.device) + ratio_sum
        self.blocks, self.model = blocks, batch.spec.name
        self.state.add(batch.indices, skips, branches)

    def compute(self) -> ResidualResult:
        n = self.state.count
        meta = {"model": self.model, "tokens": self._cfg_tokens, "estimator": self._cfg_estimator,
                "batch": self._cfg_batch, "gram_minmax": self._cfg_minmax,
                **minibatch_meta(self._cfg_estimator, self._cfg_order, self._cfg_seed, self._sorted_data),
                "num_images": n, "blocks": list(self.blocks)}
        cka = hsic_state_cka(self.state, self._cfg_estimator) if n else None
        if cka is None:
            if n:
                meta["note"] = "too few images for this estimator (minibatch and unbiased CKA need at least 4)"
            return ResidualResult(self.name, {}, meta)
        num = len(self.blocks)
        attn, mlp = cka[:num, :num], cka[num:, num:]
        ratio = self.ratio_sum / n
        tensors = {"attn_cka": attn.diagonal().clone(), "mlp_cka": mlp.diagonal().clone(),
                   "attn_cka_matrix": attn.clone(), "mlp_cka_matrix": mlp.clone(),
                   "attn_norm_ratio": ratio[0].clone(), "mlp_norm_ratio": ratio[1].clone()}
        return ResidualResult(self.name, tensors, meta)
