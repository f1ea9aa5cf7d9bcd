"""Recorded tensors over images, in one streaming pass: their mean (``HookMeans``, the reference of a mean ablation,
:func:`vitscope.interventions.reference_means`) or, for a few images, the tensors themselves (``HookTensors``, the
reference set of an analysis's ablation controls). Not registered analyses: building blocks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from vitscope.analyses.base import Analysis, Batch, Result
from vitscope.analyses.state import added, first_seen
from vitscope.errors import VitscopeValueError
from vitscope.models.spec import ModelSpec

__all__ = ["HookMeans", "HookTensors"]


class HookMeans(Analysis):
    """Sum and count of every recorded tensor of ``hooks`` over images; :meth:`compute` gives the means.

    Args:
        hooks: canonical names or glob patterns.

    State: ``sums`` (name -> float64 sum over images of one image's tensor), ``count`` (images).
    """

    name = "hook_means"

    def __init__(self, hooks: Sequence[str]) -> None:
        super().__init__()
        self._cfg_hooks = (hooks,) if isinstance(hooks, str) else tuple(hooks)
        self.add_state("sums", {}, reduce="sum")
        self.add_state("count", 0, reduce="sum")

    def required_hooks(self, spec: ModelSpec) -> list[str]:
        return list(self._cfg_hooks)

    def update(self, record: Mapping[str, torch.Tensor], batch: Batch) -> None:
        for name, tensor in record.items():
            if name in self.sums and self.sums[name].shape != tensor.shape[1:]:
                raise VitscopeValueError(f"'{name}' has shape {tuple(tensor.shape[1:])} per image here but "
                                         f"{tuple(self.sums[name].shape)} before: a mean needs images of one grid")
            self.sums[name] = added(self.sums.get(name), tensor.detach().double().sum(dim=0))
        self.count += batch.size

    def compute(self) -> Result:
        """Tensors: every hook's mean (float32, one image's shape); meta: ``num_images``."""
        if not self.count:
            raise VitscopeValueError("no image to average over")
        return Result(name=self.name, tensors={name: (s / self.count).float() for name, s in self.sums.items()},
                      meta={"num_images": int(self.count)})


class HookTensors(Analysis):
    """Every image's recorded tensors of ``hooks``, kept (on the CPU) in dataset order: the reference set of an
    ablation's controls (a few images). :meth:`compute` stacks them: ``{name: [R, ...]}``.

    State: ``kept`` (dataset index -> {name: tensor}).
    """

    name = "hook_tensors"

    def __init__(self, hooks: Sequence[str]) -> None:
        super().__init__()
        self._cfg_hooks = (hooks,) if isinstance(hooks, str) else tuple(hooks)
        self.add_state("kept", {}, reduce=first_seen)

    def required_hooks(self, spec: ModelSpec) -> list[str]:
        return list(self._cfg_hooks)

    def update(self, record: Mapping[str, torch.Tensor], batch: Batch) -> None:
        for j, index in enumerate(batch.indices):
            self.kept.setdefault(int(index), {name: t[j].detach().cpu().clone() for name, t in record.items()})

    def compute(self) -> Result:
        order = sorted(self.kept)
        if not order:
            raise VitscopeValueError("no reference image could be read")
        names = list(self.kept[order[0]])
        return Result(name=self.name, tensors={n: torch.stack([self.kept[i][n] for i in order]) for n in names},
                      meta={"indices": order})
