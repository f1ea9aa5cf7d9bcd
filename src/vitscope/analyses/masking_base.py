"""Shared plumbing of the masking analyses: accumulators that re-run the model on altered inputs.

Unlike the other analyses, these need the model itself during the pass (to classify masked or filtered
copies of every batch), so they are bound to a backbone (:meth:`ModelAccumulator.bind`) before the run;
``vitscope analyze`` binds them. The extra forwards run inside the engine's recording context, so the
record is saved before and restored after them: analyses updated later see the unaltered batch.

State is a set of correct-prediction counts (exactly mergeable); accuracy = correct / images.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from vitscope.analyses.base import Analysis, Batch, Result
from vitscope.masking.forward import logits_of
from vitscope.models.backbone import Backbone
from vitscope.models.spec import ModelSpec

__all__ = ["ModelAccumulator", "UnboundModelError", "bind_model_analyses", "topk_correct"]


class UnboundModelError(RuntimeError):
    """A masking analysis was run without a model to classify the masked images."""


def topk_correct(logits: torch.Tensor, labels: torch.Tensor, k: int) -> torch.Tensor:
    """``[B]`` bool: the label is among the ``k`` highest logits (``k`` capped at the number of classes)."""
    k = min(int(k), logits.shape[-1])
    return (logits.topk(k, dim=-1).indices == labels.to(logits.device).unsqueeze(-1)).any(dim=-1)


def bind_model_analyses(analyses, backbone: Backbone) -> list:
    """Bind every :class:`ModelAccumulator` of ``analyses`` to ``backbone`` (others are untouched)."""
    analyses = list(analyses)
    for a in analyses:
        if isinstance(a, ModelAccumulator):
            a.bind(backbone)
    return analyses


class ModelAccumulator(Analysis):
    """An accumulator that classifies altered copies of each batch with the bound model.

    Subclasses set ``name``, declare their counts in ``_declare_counts`` and implement ``_update_counts``
    and ``compute``. Reads ``batch.targets["label"]`` (class index per image, in the model's label space).
    """

    required_targets: ClassVar[tuple[str, ...]] = ("label",)
    needs_head: ClassVar[bool] = True

    run_only_params = ("workdir", "backbone")

    def __init__(self, backbone: Backbone | None = None) -> None:
        super().__init__()
        self._cfg_backbone: Backbone | None = None
        if backbone is not None:
            self.bind(backbone)
        self.add_state("num_images", 0, reduce="sum")
        self.add_state("model", None, reduce="same")
        self._declare_counts()

    # ------------------------------------------------------------ binding

    def bind(self, backbone: Backbone) -> ModelAccumulator:
        """Use ``backbone`` to classify the altered images (the model the engine runs); returns ``self``."""
        reason = self.why_unsupported(backbone.spec)
        if reason:
            raise ValueError(reason)
        self._cfg_backbone = backbone
        return self

    def why_unsupported(self, spec: ModelSpec) -> str | None:
        """One-line reason this analysis cannot run on ``spec`` (None when it can)."""
        if self.needs_head and not spec.has_head:
            return (f"analysis '{self.name}' measures classification accuracy, but {spec.name} has no classifier "
                    "head; use a classifier (e.g. tiny-vit-sup)")
        return None

    def __getstate__(self) -> dict[str, Any]:
        """Pickles carry the state, never the model (bind again after unpickling)."""
        state = dict(self.__dict__, _cfg_backbone=None)
        if "_params" in state:
            state["_params"] = dict(state["_params"], backbone=None)
        return state

    # ------------------------------------------------------------ running the model

    def _model(self) -> Backbone:
        if self._cfg_backbone is None:
            raise UnboundModelError(
                f"analysis '{self.name}' re-runs the model on masked images: bind it first "
                f"({type(self).__name__}(backbone=...) or .bind(backbone)); vitscope analyze does this"
            )
        return self._cfg_backbone

    def _logits(self, pixels: torch.Tensor, record: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The bound model's logits on ``pixels`` (the record is left as it was)."""
        return logits_of(self._run(lambda b: b(pixels), record))

    def _run(self, fn, record: Mapping[str, torch.Tensor]):
        """Call ``fn(backbone)`` and restore the record's tensors afterwards (hooks refill it on a forward)."""
        saved = dict(record.items())
        try:
            with torch.inference_mode():
                return fn(self._model())
        finally:
            if hasattr(record, "restore"):  # the same tensor objects: per-pattern memos (attention_pass) keep hitting
                record.restore(saved)
            elif hasattr(record, "put") and hasattr(record, "clear"):
                record.clear()
                for k, v in saved.items():
                    record.put(k, v)

    @staticmethod
    def _labels(batch: Batch) -> torch.Tensor:
        labels = batch.targets.get("label")
        if labels is None or any(v is None for v in labels):
            raise ValueError("the masking analyses need a class label per image (batch.targets['label']); use a "
                             "labelled dataset (e.g. ROOT::coco or ROOT::imagenet-boxes)")
        return torch.as_tensor([int(v) for v in labels], dtype=torch.long)

    # ------------------------------------------------------------ accumulator protocol

    def update(self, record: Mapping[str, torch.Tensor], batch: Batch) -> None:
        if batch.size == 0:
            return
        labels = self._labels(batch)
        self.model = self.model or batch.spec.name
        self._update_counts(record, batch, labels)
        self.num_images += batch.size

    def _declare_counts(self) -> None:
        """Declare the analysis's counts (``add_state``)."""

    @abstractmethod
    def _update_counts(self, record: Mapping[str, torch.Tensor], batch: Batch, labels: torch.Tensor) -> None:
        """Add one batch's counts (the subclass's own tensors)."""

    def _meta(self) -> dict[str, Any]:
        return {"num_images": self.num_images, "model": self.model}

    @abstractmethod
    def compute(self) -> Result:
        """The analysis's result from its counts."""
