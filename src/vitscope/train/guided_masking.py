"""Guided MAE masking with a curriculum (paper 003 section 5.2), plugged into :class:`~vitscope.train.mae.MAERecipe`.

The recipe's ``mask_fn`` is called as ``mask_fn(batch, num_patches, keep, gen)`` without the images, so the
guided recipe counts the SIFT keypoints of the batch it is about to encode (after the random resized
crop, at model resolution) and hands them to its :class:`GuidedMaskFn` just before. The share ``rho`` of
keypoint patches among the masked ones follows :func:`~vitscope.functional.curriculum_rho`: it climbs
``levels`` one step every ``every_epochs`` epochs. The masked count is the recipe's own
(``K - keep``); its split follows docs/methods.md, SIFT patch interrelation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from vitscope.errors import VitscopeRuntimeError, VitscopeValueError
from vitscope.functional.guided_mask import curriculum_rho, guided_visible_ids
from vitscope.functional.sift import sift_keypoint_counts
from vitscope.models.backbone import Backbone
from vitscope.train.mae import MAEConfig, MAERecipe

__all__ = ["DEFAULT_LEVELS", "GuidedMAERecipe", "GuidedMaskFn", "pixels_keypoint_counts"]

DEFAULT_LEVELS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)


def pixels_keypoint_counts(pixels: torch.Tensor, mean: Sequence[float], std: Sequence[float],
                           grid: Sequence[int]) -> torch.Tensor:
    """SIFT keypoints per patch of normalised images: ``[B, 3, H, W]`` -> ``[B, h, w]`` int64 (CPU)."""
    m = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)
    images = ((pixels.detach().float().cpu() * s + m).clamp(0, 1) * 255).round().to(torch.uint8)
    arrays = images.permute(0, 2, 3, 1).numpy()
    return torch.stack([sift_keypoint_counts(np.ascontiguousarray(a), grid) for a in arrays])


class GuidedMaskFn:
    """A ``mask_fn`` for MAERecipe that masks by keypoint patches (set ``counts`` and ``rho`` per batch).

    Attributes:
        counts: ``[B, h, w]`` keypoints per patch of the batch about to be encoded.
        rho: keypoint share of the masked patches.
    """

    def __init__(self) -> None:
        self.counts: torch.Tensor | None = None
        self.rho = 0.0

    def __call__(self, batch: int, num_patches: int, keep: int, gen: torch.Generator) -> torch.Tensor:
        """``ids_keep [batch, keep]`` (the MaskFn contract of :mod:`vitscope.train.mae`)."""
        if self.counts is None or self.counts.shape[0] != batch or self.counts[0].numel() != num_patches:
            raise VitscopeRuntimeError("GuidedMaskFn needs the keypoint counts of the batch first (GuidedMAERecipe "
                                       "sets them)")
        return guided_visible_ids(self.counts, keep, self.rho, gen)


class GuidedMAERecipe(MAERecipe):
    """MAE pretraining whose masks follow SIFT keypoint patches with a ``rho`` curriculum.

    Args:
        backbone: a wrapped tiny ViT.
        config: MAE hyper-parameters (the mask ratio among them).
        steps_per_epoch: optimisation steps per epoch (``len(data) // batch_size``, as :func:`~vitscope.train.fit`).
        every_epochs: epochs per curriculum level (``E``).
        levels: the ``rho`` values climbed, from easy (0: only non-keypoint patches masked) to hard (1).
    """

    name = "mae-guided"

    def __init__(self, backbone: Backbone, config: MAEConfig = MAEConfig(), steps_per_epoch: int = 1,
                 every_epochs: int = 1, levels: Sequence[float] = DEFAULT_LEVELS) -> None:
        if steps_per_epoch < 1:
            raise VitscopeValueError(f"steps_per_epoch must be at least 1, got {steps_per_epoch}")
        self.guide = GuidedMaskFn()
        super().__init__(backbone, config, mask_fn=self.guide)
        self.steps_per_epoch, self.every_epochs, self.levels = int(steps_per_epoch), int(every_epochs), tuple(levels)
        curriculum_rho(0, self.every_epochs, self.levels)  # validates the curriculum now, not at step 1
        self._step = 0

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "curriculum": {"steps_per_epoch": self.steps_per_epoch,
                                                     "every_epochs": self.every_epochs, "levels": list(self.levels)}}

    def rho_at(self, step: int) -> float:
        """The curriculum's ``rho`` at optimisation step ``step``."""
        return curriculum_rho(step // self.steps_per_epoch, self.every_epochs, self.levels)

    def loss(self, images: torch.Tensor, labels: torch.Tensor, step: int, gen: torch.Generator,
             foreground: torch.Tensor | None = None) -> torch.Tensor:
        self._step = step
        return super().loss(images, labels, step, gen, foreground)

    def encode_visible(self, pixels: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        spec = self._backbone.spec
        self.guide.counts = pixels_keypoint_counts(pixels, spec.mean, spec.std, spec.grid)
        self.guide.rho = self.rho_at(self._step)
        return super().encode_visible(pixels, gen)
