"""``HookMeans``: the mean over images of any recorded tensors, in one streaming pass (the reference of a mean
ablation, :func:`vitscope.interventions.reference_means`). Not a registered analysis: a building block."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from vitscope.analyses.base import Analysis, Batch, Result
from vitscope.analyses.state import added
from vitscope.errors import VitscopeValueError
from vitscope.models.spec import ModelSpec

__all__ = ["HookMeans"]


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
