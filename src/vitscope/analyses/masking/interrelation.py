"""Spurious-correlation discovery by interrelation masking (paper 003 section 5.1, figure 8).

Every patch gets the score ``P_i`` of one block averaged over its heads
(:func:`~vitscope.functional.interrelation_patch_scores`); the ``Top`` (highest scores) or ``Bottom`` (lowest)
``ratio`` of the patches is masked and the image classified again. A seeded random mask of the same size
is the baseline. When the data has segmentation masks, the share of masked patches that lie on the
background says whether the flagged patches are background (the spurious-correlation check).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitscope.analyses.attention.interrelation import batch_keypoint_counts
from vitscope.analyses.base import Batch, Figure, Result
from vitscope.analyses.batch import SIFT_KEYPOINTS
from vitscope.analyses.masking.base import ModelAccumulator, topk_correct
from vitscope.analyses.registry import register_analysis
from vitscope.errors import VitscopeValueError
from vitscope.functional.interrelation import check_detection, interrelation_patch_scores
from vitscope.functional.occlusion import (
    FILLS,
    masked_count,
    pixel_to_patch_mask,
    random_patch_mask,
    score_patch_mask,
)
from vitscope.models.spec import ModelSpec
from vitscope.occlusion.forward import MODES, masked_logits
from vitscope.occlusion.regions import Frame, foreground_pixel_mask
from vitscope.strict_json import note_null

__all__ = ["DEFAULT_RATIOS", "InterrelationMasking", "InterrelationMaskingResult"]

DEFAULT_RATIOS: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
ORDERS: tuple[str, ...] = ("top", "bottom", "random")
#: the target the loader adds: ``[h, w]`` bool background patches of an image with objects (None without)
BACKGROUND = "background_patches"


def background_patches(masks: Any, spec: ModelSpec, grid: tuple[int, int] | None = None,
                       frame: Frame | None = None) -> np.ndarray | None:
    """One image's background patches: ``[h, w]`` bool, a patch being foreground when half of its pixels lie on
    an object's segmentation mask; None for an image without objects (host work, made by the loader).

    Args:
        masks: ``[n, H0, W0]`` instance masks at the image's size.
        spec: the model's spec (its resize and crop, and the patch size).
        grid: the token grid (None: the image's own, ``spec.grid_for`` of its size at model resolution).
        frame: the run's view's geometry (``Batch.frame``); None: the model's own resize and crop.
    """
    if masks is None or len(masks) == 0:
        return None
    fg = foreground_pixel_mask(masks, spec, "mask", frame)
    grid = spec.grid_for(*fg.shape) if grid is None else grid
    return (~pixel_to_patch_mask(fg[None], grid, 0.5)[0]).numpy()


class InterrelationMaskingResult(Result):
    """Result of :class:`InterrelationMasking`: figure 8 (accuracy against the mask ratio)."""

    DIMS = {"*": ("order", "ratio")}

    def figures(self) -> list[Figure]:
        """``<name>``: accuracy of Top / Bottom / random masking against the mask ratio."""
        if "accuracy" not in self.tensors:
            return []
        m, model = self.meta, self.meta.get("model") or "model"
        title = (f"Masking by interrelation score (block {m['block']}, {m['mode']} "
                 f"{m['fill'] if m['mode'] == 'pixel' else ''}, {m['num_images']} images)")

        from vitscope.viz.masking_charts import ratio_chart

        curves = {model: {o: self.tensors["accuracy"][i] for i, o in enumerate(m["orders"])}}
        full = {model: float(self.tensors["full_accuracy"])}

        def draw(path: Path) -> list[Path]:
            from vitscope.viz.masking_figures import ratio_curves_figure

            return ratio_curves_figure(curves, m["ratios"], full, title, path)

        return [self.figure("", draw, "Accuracy against the share of masked patches, masking the highest "
                            "interrelation scores first (top), the lowest first (bottom) or at random; the thin line "
                            "is the unmasked accuracy.", "paper 003, fig. 8",
                            chart=ratio_chart(curves, m["ratios"], full, title))]


@register_analysis("interrelation_masking", groups=("masking",), default=False, order=170)
class InterrelationMasking(ModelAccumulator):
    """Top / Bottom / random masking by the interrelation score at several ratios, top-1 accuracy.

    Args:
        ratios: mask ratios (fractions of the patches, each masks ``floor(ratio * K + 0.5)``).
        block: block whose attention gives the scores (negative counts from the end; default the last).
        lam, rule: interrelation detection line (docs/methods.md, SIFT patch interrelation).
        mode: ``"pixel"`` (fill the masked patches) or ``"drop"`` (drop their tokens; on a model without prefix
            tokens every ratio must keep a patch).
        fill, blur_sigma: pixel filling.
        seed: random-mask baseline (image ``i`` draws from ``seed * 1000003 + i`` modulo 2**64, whatever the
            batching, so any integer works).

    Result meta ``flagged_on_background`` (with segmentation masks): whether the Top / Bottom masked patches at
    the small ratios (<= 20%) lie on the background more often than patches do overall
    (``flagged_background_share`` against ``background_share_of_all_patches``).

    State: ``num_images``, ``full_correct`` (int), ``correct`` ``[3, R]`` float64 (top, bottom, random);
    ``background_masked`` ``[2, R]`` masked patches on the background (top, bottom), ``masked_with_masks``
    ``[2, R]`` masked patches of images with segmentation masks, ``background_patches`` and ``patches``.
    """

    description = ("Accuracy when the patches with the highest (Top) or lowest (Bottom) interrelation score are "
                   "masked, against a random order, at growing mask ratios.")
    summary = "accuracy when masking by SIFT interrelation"

    needs_attention = True

    def __init__(self, ratios: Sequence[float] = DEFAULT_RATIOS, block: int = -1, lam: float = 0.5,
                 rule: str = "max", mode: str = "pixel", fill: str = "mean", blur_sigma: float = 4.0,
                 seed: int = 0) -> None:
        check_detection(lam, rule)
        if mode not in MODES or fill not in FILLS:
            raise VitscopeValueError(f"mode must be one of {MODES}, fill one of {FILLS}, got {mode!r} and {fill!r}")
        if not ratios or any(not 0 <= r <= 1 for r in ratios):
            raise VitscopeValueError(f"ratios must be fractions in [0, 1], got {list(ratios)}")
        self._cfg_ratios = tuple(float(r) for r in ratios)
        self._cfg_block, self._cfg_lam, self._cfg_rule = int(block), float(lam), rule
        self._cfg_mode, self._cfg_fill, self._cfg_blur = mode, fill, float(blur_sigma)
        self._cfg_seed = int(seed)
        super().__init__()

    def why_unsupported(self, spec: ModelSpec) -> str | None:
        if not spec.is_transformer:
            return (f"analysis '{self.name}' scores patches by their attention, but {spec.name} is a CNN; use "
                    "foreground_masking and frequency_filtering for CNNs")
        k = spec.grid[0] * spec.grid[1]
        every = [r for r in self._cfg_ratios if masked_count(r, k) == k]
        if self._cfg_mode == "drop" and spec.num_prefix_tokens == 0 and every:
            return (f"analysis '{self.name}' with mode='drop' would drop every token of {spec.name}, which has no "
                    f"prefix token (CLS) to keep, at ratio {every[0]} ({k} of {k} patches); use ratios that keep a "
                    "patch or mode='pixel'")
        return super().why_unsupported(spec)

    def _block(self, spec: ModelSpec) -> int:
        if not -spec.num_blocks <= self._cfg_block < spec.num_blocks:
            raise VitscopeValueError(f"block {self._cfg_block} does not exist; {spec.name} has {spec.num_blocks} "
                                     "blocks")
        return self._cfg_block % spec.num_blocks

    def required_hooks(self, spec: ModelSpec) -> list[str]:
        return [f"blocks.{self._block(spec)}.attn.pattern"] if spec.is_transformer else ["blocks.*.attn.pattern"]

    def shared_quantities(self, spec: ModelSpec) -> dict[str, frozenset[str]]:
        return {SIFT_KEYPOINTS: frozenset()}

    def target_transforms(self, spec: ModelSpec) -> dict[str, tuple[str, Callable[[Any], Any]]]:
        """The background patches of every image with objects, made where images decode (the loader)."""
        return {BACKGROUND: ("masks", functools.partial(background_patches, spec=spec))}

    def _declare_counts(self) -> None:
        r = len(self._cfg_ratios)
        self.add_state("full_correct", torch.zeros((), dtype=torch.float64))
        self.add_state("correct", torch.zeros(len(ORDERS), r, dtype=torch.float64))
        self.add_state("background_masked", torch.zeros(2, r, dtype=torch.float64))
        self.add_state("masked_with_masks", torch.zeros(2, r, dtype=torch.float64))
        self.add_state("background_patches", 0, reduce="sum")
        self.add_state("patches_with_masks", 0, reduce="sum")
        self.add_state("block", None, reduce="same")

    def _random_masks(self, batch: Batch, ratio: float) -> torch.Tensor:
        # modulo torch's 64-bit seed range; torch itself maps negative seeds the same way
        gens = [torch.Generator().manual_seed((self._cfg_seed * 1_000_003 + int(i)) % 2**64) for i in batch.indices]
        return torch.cat([random_patch_mask(1, batch.grid, ratio, g) for g in gens])

    def _update_counts(self, record: Mapping[str, torch.Tensor], batch: Batch, labels: torch.Tensor) -> None:
        """Add the batch's correct predictions at every order and ratio, and where the masked patches lie: every
        mask is made and counted on the batch's device (a fixed number of patches per image), nothing is read
        back."""
        spec, grid, device = batch.spec, tuple(batch.grid), batch.pixels.device
        labels = labels.to(device, non_blocking=True)  # once, not at every comparison
        self.block = self._block(spec)
        full = self._full_logits(batch.pixels, batch)  # first: it refuses labels the head does not have
        pattern = record[f"blocks.{self.block}.attn.pattern"]
        counts = batch_keypoint_counts(batch, record).to(pattern.device, non_blocking=True)
        scores = interrelation_patch_scores(pattern, counts, grid, spec.num_prefix_tokens, self._cfg_lam,
                                            self._cfg_rule).to(device)  # [B, h, w]
        background = self._background(batch, grid)
        for name in ("full_correct", "correct", "background_masked", "masked_with_masks"):
            setattr(self, name, getattr(self, name).to(device))  # restored from a checkpoint: on the host

        def classify(mask: torch.Tensor) -> torch.Tensor:
            return self._run(lambda b: masked_logits(b, batch.pixels, mask, self._cfg_mode, self._cfg_fill,
                                                     self._cfg_blur), batch)

        self.full_correct += topk_correct(full, labels, 1).sum()
        for j, ratio in enumerate(self._cfg_ratios):
            for i, order in enumerate(ORDERS):
                if order == "random":  # seeded per image on the host; queued to the device without waiting
                    mask = self._random_masks(batch, ratio).to(device, non_blocking=True)
                else:
                    mask = score_patch_mask(scores, ratio, order)
                self.correct[i, j] += topk_correct(classify(mask), labels, 1).sum()
                if order != "random" and background is not None:
                    have, bg = background
                    self.background_masked[i, j] += (mask & bg).sum()
                    self.masked_with_masks[i, j] += (mask & have).sum()

    def _background(self, batch: Batch, grid: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(images with masks [B, 1, 1] bool, their background patches [B, h, w] bool)`` on the batch's device
        (False for the images without masks), or None without masks. Counted on the host (numpy) from the
        loader's :data:`BACKGROUND`, or from the masks here, in the view's geometry (``batch.frame``), when the
        loader did not make it (a view)."""
        masks = batch.targets.get("masks")
        if masks is None:
            return None
        patches = batch.targets.get(BACKGROUND)
        if patches is None or len(patches) != batch.size or any(p is not None and p.shape != grid for p in patches):
            patches = [background_patches(m, batch.spec, grid, batch.frame) for m in masks]
        have = np.array([p is not None for p in patches], dtype=bool)
        bg = np.stack([p if p is not None else np.zeros(grid, dtype=bool) for p in patches])
        self.background_patches += int(bg[have].sum())
        self.patches_with_masks += int(have.sum()) * grid[0] * grid[1]
        device = batch.pixels.device
        return (torch.from_numpy(have).reshape(-1, 1, 1).to(device, non_blocking=True),
                torch.from_numpy(bg).to(device, non_blocking=True))

    def compute(self) -> InterrelationMaskingResult:
        meta = self._meta() | {"ratios": list(self._cfg_ratios), "orders": list(ORDERS), "block": self.block,
                               "lam": self._cfg_lam, "rule": self._cfg_rule, "mode": self._cfg_mode,
                               "fill": self._cfg_fill, "seed": self._cfg_seed}
        if self.num_images == 0:
            return InterrelationMaskingResult(name=self.name, tensors={}, meta=meta)
        n = self.num_images
        tensors = {"accuracy": self.correct / n, "full_accuracy": self.full_correct.to(torch.float64) / n}
        tensors["accuracy_change"] = tensors["accuracy"] - tensors["full_accuracy"]
        if self.patches_with_masks:
            nan = torch.full_like(self.masked_with_masks, float("nan"))
            share = torch.where(self.masked_with_masks > 0, self.background_masked / self.masked_with_masks.clamp(
                min=1), nan)
            tensors["background_share"] = share  # [2, R]: of the Top / Bottom masked patches
            if share.isnan().any():
                note_null(meta, "background_share", "no masked patch had an object mask at some ratio")
            base = self.background_patches / self.patches_with_masks
            meta["background_share_of_all_patches"] = base
            # the flagged patches are the few most extreme ones: judge them at the small ratios (<= 20%, else
            # the smallest positive one); at large ratios every order tends to the base share
            small = [j for j, r in enumerate(self._cfg_ratios) if 0 < r <= 0.2] or \
                [min((j for j, r in enumerate(self._cfg_ratios) if r > 0), key=lambda j: self._cfg_ratios[j],
                     default=0)]
            flagged = {order: float(share[i, small].nanmean()) for i, order in enumerate(("top", "bottom"))}
            meta["flagged_background_share"] = flagged
            meta["flagged_on_background"] = {order: bool(v > base) for order, v in flagged.items()}
        return InterrelationMaskingResult(name=self.name, tensors=tensors, meta=meta)
