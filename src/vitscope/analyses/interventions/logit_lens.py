"""The logit lens: the model's own readout (final norm, then its classifier head or its embedding) applied to the
residual stream after every block, to see from which block on the final answer is there (nostalgebraist 2020;
for ViTs e.g. Vilas et al. 2023)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import torch

from vitscope.analyses.base import Analysis, Batch, Figure, Result
from vitscope.analyses.registry import register_analysis
from vitscope.analyses.state import added
from vitscope.errors import VitscopeRuntimeError
from vitscope.hooks.names import split_block_name
from vitscope.models.outputs import readout
from vitscope.models.spec import ModelSpec
from vitscope.viz.charts import block_lines_chart, curve

__all__ = ["LogitLens", "LogitLensResult"]

SITE = "blocks.*.resid_post"


class LogitLensResult(Result):
    """Result of :class:`LogitLens`: per-block curves."""

    DIMS = {"*": ("block",)}

    def figures(self) -> list[Figure]:
        """``<name>``: every per-block quantity over blocks (in the browser)."""
        t, labels = self.tensors, self.meta.get("blocks")
        keys = [k for k in ("accuracy", "agreement", "cosine") if k in t]
        if not keys:
            return []
        names = {"accuracy": "top-1 accuracy (labels)", "agreement": "top-1 = final prediction",
                 "cosine": "cosine to the final embedding"}
        chart = block_lines_chart([curve(names[k], t[k], names[k]) for k in keys], "share / cosine", len(t[keys[0]]),
                                  labels, "The model's readout after every block", (0.0, 1.0))

        def draw(path: Path) -> list[Path]:
            from vitscope.viz.attention_figures import block_lines_figure

            return block_lines_figure({names[k]: (t[k], None) for k in keys}, "The model's readout after every block",
                                      "share / cosine", path, block_labels=labels, value_range=(0.0, 1.0))

        figures = [self.figure("", draw, "The model's final norm and readout applied after every block: how often "
                               "its top class is already the final one (or the label), or how close its pooled "
                               "token is to the final embedding.", "logit lens (nostalgebraist 2020)", chart=chart)]
        if "kl" in t:
            kl_chart = block_lines_chart([curve("KL(final || block)", t["kl"], "kl")], "nats", len(t["kl"]), labels,
                                         "KL divergence of each block's prediction from the final one")

            def draw_kl(path: Path) -> list[Path]:
                from vitscope.viz.attention_figures import block_lines_figure

                return block_lines_figure({"KL(final || block)": (t["kl"], None)},
                                          "KL divergence of each block's prediction from the final one", "nats", path,
                                          block_labels=labels)
            figures.append(self.figure("_kl", draw_kl, "KL divergence (nats) of the class distribution read after each "
                                       "block from the final one; 0 at the last block.",
                                       "logit lens (nostalgebraist 2020)", chart=kl_chart))
        return figures


@register_analysis("logit_lens", groups=("interventions",), default=False, order=200)
class LogitLens(Analysis):
    """The model's readout after every block.

    A classifier's head (after the final norm, as the model applies it) on each block's output: per block, top-1
    agreement with the final prediction, top-1 accuracy over the images that have a label (counted image by image,
    so no number depends on the batch), and the mean
    KL divergence KL(final || block) of the softmax distributions. An embedding model (no head): the pooled token
    of each block's final-normed output (the CLS token, or the mean of the spatial tokens without one) and its
    cosine to the last block's, mean over images.

    State: ``num_images``, ``labelled``; sums ``[L]`` of agreement, correct, KL, cosine (float64).
    """

    description = ("Logit lens: the model's own final norm and readout applied after every block, showing from which "
                   "block on the final prediction (or embedding) is already there.")
    summary = "the model's readout after every block"
    needs_transformer: ClassVar[bool] = True
    reruns_model: ClassVar[bool] = True

    def __init__(self) -> None:
        super().__init__()
        self.add_state("num_images", 0, reduce="sum")
        self.add_state("labelled", 0, reduce="sum")
        self.add_state("blocks", [], reduce="same")
        self.add_state("mode", "", reduce="same")
        self.add_state("sums", {}, reduce="sum")  # quantity -> [L] float64

    def required_hooks(self, spec: ModelSpec) -> list[str]:
        return [SITE]

    def stream_hooks(self, spec: ModelSpec) -> list[str]:
        return [SITE]

    def record_reads(self, spec: ModelSpec) -> list[str]:
        return []  # every block is read as the model makes it

    def update_hook(self, name: str, tensor: torch.Tensor, batch: Batch) -> None:
        """The readout of one block: logits ``[B, C]`` (classifier) or the pooled embedding ``[B, D]``."""
        if batch.model is None:
            raise VitscopeRuntimeError("logit_lens applies the model's head after every block: run it through "
                                       "vitscope.run, which hands every batch its model")
        block = split_block_name(name)[0]
        self.per_batch(batch).setdefault("readouts", {})[block] = batch.model.run(lambda b: readout(b, tensor))

    def update(self, record: Mapping[str, torch.Tensor], batch: Batch) -> None:
        scratch = self.per_batch(batch)
        if "readouts" not in scratch:  # not fed by the engine: read the record now
            for key in record:
                if split_block_name(key) and key.endswith(".resid_post"):
                    self.update_hook(key, record[key], batch)
        readouts = scratch.get("readouts", {})
        if not readouts or batch.size == 0:
            return
        blocks = sorted(readouts)
        self.blocks = self.blocks or blocks
        out = torch.stack([readouts[i] for i in blocks])  # [L, B, C or D]
        final = out[-1]
        sums: dict[str, torch.Tensor] = {}
        if batch.spec.classifies:  # a metric net's projected embeddings are compared by cosine, as a headless one's
            self.mode = "classifier"
            predicted = final.argmax(-1)
            sums["agreement"] = (out.argmax(-1) == predicted).double().sum(-1)
            log_final, log_block = final.log_softmax(-1), out.log_softmax(-1)
            sums["kl"] = (log_final.exp() * (log_final - log_block)).sum(-1).double().sum(-1)
            labels = batch.targets.get("label") if batch.targets else None
            known = [j for j, v in enumerate(labels) if v is not None and int(v) >= 0] if labels is not None else []
            if known:  # accuracy over the labelled images only, whichever batch holds them
                y = torch.as_tensor([int(labels[j]) for j in known], device=out.device)
                sums["correct"] = (out[:, known].argmax(-1) == y).double().sum(-1)
                self.labelled += len(known)
        else:
            self.mode = "embedding"
            sums["cosine"] = torch.nn.functional.cosine_similarity(out, final.unsqueeze(0), dim=-1).double().sum(-1)
        for key, value in sums.items():
            self.sums[key] = added(self.sums.get(key), value)
        self.num_images += batch.size

    def compute(self) -> LogitLensResult:
        meta = {"num_images": self.num_images, "blocks": list(self.blocks), "mode": self.mode,
                "labelled_images": self.labelled}
        tensors = {}
        if self.num_images:
            for key, name in (("agreement", "agreement"), ("kl", "kl"), ("cosine", "cosine")):
                if key in self.sums:
                    tensors[name] = self.sums[key] / self.num_images
            if "correct" in self.sums and self.labelled:
                tensors["accuracy"] = self.sums["correct"] / self.labelled
        return LogitLensResult(name=self.name, tensors=tensors, meta=meta)
