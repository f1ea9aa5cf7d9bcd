"""Shared plumbing of the masking analyses: analyses that re-run the model on altered inputs.

Unlike the other analyses, these classify masked or filtered copies of every batch, so they need the model
during the pass: the engine hands it over with the batch (``batch.model``, a
:class:`~vitscope.analyses.batch.ModelRunner` that pauses the recording during the extra forwards, so the
record stays the batch's own for every analysis).

State is a set of correct-prediction counts (exactly mergeable); accuracy = correct / images.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

import torch

from vitscope.analyses.base import Analysis, Batch, Result
from vitscope.analyses.batch import ModelRunner
from vitscope.analyses.data_checks import DataFacts
from vitscope.errors import VitscopeRuntimeError, VitscopeValueError
from vitscope.models.backbone import Backbone
from vitscope.models.spec import ModelSpec

__all__ = ["ModelAccumulator", "NoModelError", "topk_correct"]

T = TypeVar("T")


class NoModelError(VitscopeRuntimeError):
    """A masking analysis was fed a batch without the model to classify the masked images."""


def topk_correct(logits: torch.Tensor, labels: torch.Tensor, k: int) -> torch.Tensor:
    """``[B]`` bool: the label is among the ``k`` highest logits (``k`` capped at the number of classes)."""
    k = min(int(k), logits.shape[-1])
    return (logits.topk(k, dim=-1).indices == labels.to(logits.device).unsqueeze(-1)).any(dim=-1)


class ModelAccumulator(Analysis):
    """An analysis that classifies altered copies of each batch with the model of the pass (``batch.model``).

    Subclasses declare their counts in ``_declare_counts`` and implement ``_update_counts`` and ``compute``.
    Reads ``batch.targets["label"]`` (class index per image, in the model's label space); the first forward of
    each batch (:meth:`_full_logits`) refuses a label beyond the head's classes.
    """

    required_targets: ClassVar[tuple[str, ...]] = ("label",)
    needs_head: ClassVar[bool] = True
    reruns_model: ClassVar[bool] = True
    needs_pixels: ClassVar[bool] = True  # it alters them and classifies them again
    #: the error when a batch lacks labels: what the analysis needs and where to find it
    missing_labels: ClassVar[str] = ("the masking analyses need a class label per image (batch.targets['label']); use "
                                     "a labelled dataset (e.g. ROOT::coco or ROOT::imagenet-boxes)")

    def __init__(self) -> None:
        super().__init__()
        self.add_state("num_images", 0, reduce="sum")
        self.add_state("model", None, reduce="same")
        self._declare_counts()

    def why_unsupported(self, spec: ModelSpec) -> str | None:
        """One-line reason this analysis cannot run on ``spec`` (None when it can)."""
        if self.needs_head and not spec.classifies:
            what = "head projects an embedding (a metric-learning net: no classes)" if spec.has_head else \
                "has no classifier head"
            return (f"analysis '{self.name}' measures classification accuracy, but {spec.name}'s {what}; use a "
                    "classifier (e.g. tiny-vit-sup)")
        return None

    def why_unsupported_data(self, data: DataFacts) -> str | None:
        """No labels: :attr:`missing_labels` (what labels, in which label space); then the other ground truth."""
        if "label" not in data.targets:
            return self.missing_labels
        labels = data.labels
        if labels is not None and (labels < 0).any():  # accuracy needs every image's class
            return (f"analysis '{self.name}' scores the model's predictions against each image's class, but "
                    f"{int((labels < 0).sum())} of {labels.size} images of {data.name} have no label; use data "
                    "where every image has one")
        return super().why_unsupported_data(data)

    def __getstate__(self) -> dict[str, Any]:
        """Pickles carry the state, never the model (bind again after unpickling)."""
        state = dict(self.__dict__, _cfg_backbone=None)
        if "_params" in state:
            state["_params"] = dict(state["_params"], backbone=None)
        return state

    # ------------------------------------------------------------ running the model

    def _runner(self, batch: Batch) -> ModelRunner:
        if batch.model is None:
            raise NoModelError(
                f"analysis '{self.name}' re-runs the model on masked images, but this batch carries no model; "
                "run it through vitscope.run (which hands every batch its model) or set "
                "batch.model = ModelRunner(backbone, record)"
            )
        return batch.model

    def _logits(self, pixels: torch.Tensor, batch: Batch) -> torch.Tensor:
        """The model's logits on ``pixels`` (nothing is recorded meanwhile)."""
        return self._runner(batch).logits(pixels)

    def _run(self, fn: Callable[[Backbone], T], batch: Batch) -> T:
        """``fn(backbone)`` with nothing recorded meanwhile."""
        return self._runner(batch).run(fn)

    def _full_logits(self, pixels: torch.Tensor, batch: Batch) -> torch.Tensor:
        """The model's logits on the unaltered ``pixels``, once every label of the batch is known to be a class."""
        logits = self._logits(pixels, batch)
        self._check_label_range(batch, logits.shape[-1])
        return logits

    def _check_label_range(self, batch: Batch, classes: int) -> None:
        """Refuse labels that are not class indices of the head (``classes`` logits): they would score 0 silently.

        Reads the loader's host labels (plain integers), so nothing waits for the device.
        """
        top = max(int(v) for v in batch.targets["label"])
        if top >= classes:
            raise VitscopeValueError(
                f"analysis '{self.name}' scores each image's label as a class of the model's head, but label {top} "
                f"is not one of {batch.spec.name}'s {classes} classes (0 to {classes - 1}); use labels in the "
                "model's label space (data labelled for its classes)")

    def _labels(self, batch: Batch) -> torch.Tensor:
        labels = batch.targets.get("label")
        if labels is None or any(v is None for v in labels):
            raise VitscopeValueError(self.missing_labels)
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
