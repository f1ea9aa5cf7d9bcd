"""Low- and high-pass Fourier filtering sweeps (robustness; ViT beside CNN as paper 001 section 5).

Each image is turned back into pixel space, filtered (:func:`~vitscope.functional.frequency_filter`) at
every cut-off radius, normalised again and classified; top-1 accuracy per filter kind and radius. Radii
are fractions of ``min(H, W) / 2`` (the highest frequency along the shorter axis).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from vitscope.analyses.base import Batch, Figure, Result
from vitscope.analyses.masking.base import ModelAccumulator, topk_correct
from vitscope.analyses.registry import register_analysis
from vitscope.analyses.state import added
from vitscope.errors import VitscopeValueError
from vitscope.functional.frequency import KINDS, frequency_filter

__all__ = ["DEFAULT_FRACTIONS", "FrequencyFiltering", "FrequencyFilteringResult"]

DEFAULT_FRACTIONS: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)


class FrequencyFilteringResult(Result):
    """Result of :class:`FrequencyFiltering`: accuracy against the cut-off per filter."""

    DIMS = {"*": ("kind", "fraction")}

    def figures(self) -> list[Figure]:
        """``<name>``: low-pass and high-pass accuracy against the cut-off."""
        if "accuracy" not in self.tensors:
            return []
        model = self.meta.get("model") or "model"

        from vitscope.viz.masking_charts import frequency_chart

        accuracy, full = {model: self.tensors["accuracy"]}, {model: float(self.tensors["full_accuracy"])}

        def draw(path: Path) -> list[Path]:
            from vitscope.viz.masking_figures import frequency_figure

            return frequency_figure(accuracy, self.meta["fractions"], full, path)

        return [self.figure("", draw, "Accuracy against the cut-off radius of low-pass and high-pass filters; the "
                            "thin line is the unfiltered accuracy.", "paper 001, section 5",
                            chart=frequency_chart(accuracy, self.meta["fractions"], full))]


@register_analysis("frequency_filtering", groups=("masking",), default=False, order=190)
class FrequencyFiltering(ModelAccumulator):
    """Top-1 accuracy under low-pass and high-pass filtering at a sweep of cut-off radii (any classifier).

    Args:
        fractions: cut-off radii as fractions of ``min(H, W) / 2``.
        clamp: clip the filtered images to ``[0, 1]`` before normalising (default False: the plain filter).

    State: ``num_images``, ``full_correct``, ``correct`` ``[2, R]`` float64 (low, high), ``radii`` (input size
    ``"HxW"`` -> radii in pixels). meta ``radii``: the radii in pixels, or ``{"HxW": radii}`` when images kept
    their aspect ratios (each filtered at its own size's radii).
    """

    description = ("Accuracy after low-pass and high-pass filtering in the Fourier domain, over a sweep of cut-off "
                   "radii.")
    summary = "accuracy under low/high-pass filtering"


    def __init__(self, fractions: Sequence[float] = DEFAULT_FRACTIONS, clamp: bool = False) -> None:
        if not fractions or any(f < 0 for f in fractions):
            raise VitscopeValueError(f"fractions must be non-negative, got {list(fractions)}")
        self._cfg_fractions = tuple(float(f) for f in fractions)
        self._cfg_clamp = bool(clamp)
        super().__init__()

    def required_hooks(self, spec) -> list[str]:
        return []

    def _declare_counts(self) -> None:
        self.add_state("full_correct", torch.zeros((), dtype=torch.float64), reduce="sum")
        self.add_state("correct", torch.zeros(len(KINDS), len(self._cfg_fractions), dtype=torch.float64))
        self.add_state("radii", {}, reduce="same")  # "HxW" input size in pixels -> radii in pixels

    def _update_counts(self, record: Mapping[str, torch.Tensor], batch: Batch, labels: torch.Tensor) -> None:
        spec = batch.spec
        mean = torch.tensor(spec.mean, dtype=batch.pixels.dtype, device=batch.pixels.device).view(1, 3, 1, 1)
        std = torch.tensor(spec.std, dtype=batch.pixels.dtype, device=batch.pixels.device).view(1, 3, 1, 1)
        images = batch.pixels * std + mean
        half = min(batch.pixels.shape[-2:]) / 2
        radii = [f * half for f in self._cfg_fractions]
        self.radii["x".join(str(int(v)) for v in batch.pixels.shape[-2:])] = radii
        full = topk_correct(self._full_logits(batch.pixels, batch), labels, 1).sum().to(torch.float64)
        self.full_correct = added(self.full_correct, full)  # counts stay on the batch's device
        self.correct = self.correct.to(full.device)
        for i, kind in enumerate(KINDS):
            for j, radius in enumerate(radii):
                filtered = frequency_filter(images, radius, kind)
                if self._cfg_clamp:
                    filtered = filtered.clamp(0, 1)
                logits = self._logits((filtered - mean) / std, batch)
                self.correct[i, j] += topk_correct(logits, labels, 1).sum()

    def compute(self) -> FrequencyFilteringResult:
        # radii in pixels: of the one input size, or per input size when images kept their aspect ratios
        radii = next(iter(self.radii.values())) if len(self.radii) == 1 else dict(sorted(self.radii.items()))
        meta = self._meta() | {"kinds": list(KINDS), "fractions": list(self._cfg_fractions), "radii": radii or None,
                               "clamp": self._cfg_clamp}
        if self.num_images == 0:
            return FrequencyFilteringResult(name=self.name, tensors={}, meta=meta)
        n = self.num_images
        return FrequencyFilteringResult(name=self.name, tensors={
            "accuracy": self.correct / n, "full_accuracy": torch.as_tensor(self.full_correct, dtype=torch.float64) / n},
            meta=meta)
