"""Is spatial information kept in individual channels? (paper 001 appendix F).

For a unit and one of its most-activating images: a patch is *active* when the unit's activation there
exceeds ``threshold`` (0.5 in the paper). Inactive patches are blacked out (pixels 0, before the
model's normalisation); this is the reference image. Then a growing fraction ``x`` of the initially
active patches is blacked out too (random order, seeded) and the number and the sum of the active
patches of the modified image are divided by those of the reference. If the unit keeps spatial
information, both ratios fall linearly, ``~ 1 - x``; a flat curve means the channel mixes tokens.

The paper divides by "the initial image"; we take the image with inactive patches already removed as the
reference, so every curve starts at exactly 1 and only the removal of active patches moves it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vitscope.analyses.base import Analysis, Batch
from vitscope.errors import VitscopeValueError
from vitscope.featviz.objectives import ChannelObjective, spatial_channel
from vitscope.featviz.render import StagedForward, frozen
from vitscope.functional.faithfulness import patch_pixel_mask
from vitscope.models.backbone import Backbone

__all__ = ["PreprocessedImages", "SpatialCurve", "linearity", "spatial_information", "spatial_information_by_block",
           "unit_maps"]


class PreprocessedImages(Analysis):
    """The model inputs of a pass, kept whole (the candidate images every unit's test re-runs).

    State: ``pixels``, a list of ``[B, 3, H, W]`` CPU tensors in pass order (concatenated). ``compute`` gives
    ``{"pixels": [N, 3, H, W]}``. Meant for a few hundred images: they all stay in memory.
    """

    name = "preprocessed_images"

    def __init__(self) -> None:
        super().__init__()
        self.add_state("pixels", [], reduce="cat")

    def required_hooks(self, spec) -> list[str]:
        return []

    def update(self, record, batch: Batch) -> None:
        self.pixels.append(batch.pixels.detach().cpu())

    def compute(self) -> dict[str, torch.Tensor]:
        return {"pixels": torch.cat(self.pixels) if self.pixels else torch.empty(0, 3, 0, 0)}


@torch.no_grad()
def unit_maps(backbone: Backbone, site: str, channel: int | Sequence[int], images01: torch.Tensor,
              batch_size: int = 64) -> torch.Tensor:
    """Units' activations on every spatial token, one forward for all channels.

    Args:
        backbone: the model.
        site: canonical hook name.
        channel: one channel, or a list of ``C`` channels.
        images01: ``[B, 3, H, W]`` in [0, 1] (or uint8).
        batch_size: images per forward.

    Returns:
        ``[B, K]`` float64 for one channel, ``[B, K, C]`` for a list.
    """
    single = isinstance(channel, int)
    chans = [channel] if single else [int(c) for c in channel]
    x = images01.float() / 255.0 if images01.dtype == torch.uint8 else images01.float()
    forward = StagedForward(backbone, [ChannelObjective(site, chans[0])])
    out = []
    with frozen(backbone.model), backbone.record([site]) as rec:
        for chunk in x.split(batch_size):
            acts = forward(rec, chunk.to(backbone.device))
            out.append(torch.stack([spatial_channel(acts[site], c, backbone.spec, f"{site}:{c}") for c in chans],
                                   dim=-1).double().cpu())
    maps = torch.cat(out)
    return maps[..., 0] if single else maps


@dataclass
class SpatialCurve:
    """Mean ratios over the images that had an active patch.

    Attributes:
        fractions: ``[F]`` fraction of the active patches removed.
        count_ratio: ``[F]`` active-patch count / reference count.
        sum_ratio: ``[F]`` sum of activations over active patches / reference sum.
        images_used: images with at least one active patch in the reference.
    """

    fractions: torch.Tensor
    count_ratio: torch.Tensor
    sum_ratio: torch.Tensor
    images_used: int


def linearity(fractions: torch.Tensor, ratio: torch.Tensor) -> dict[str, float]:
    """How linear a curve is: R^2 of the least-squares line, its slope, and the mean gap to ``1 - x``."""
    x, y = fractions.double(), ratio.double()
    xm, ym = x.mean(), y.mean()
    slope = ((x - xm) * (y - ym)).sum() / ((x - xm).square().sum()).clamp_min(1e-12)
    fit = ym + slope * (x - xm)
    ss_tot = (y - ym).square().sum()
    r2 = 1.0 - float((y - fit).square().sum() / ss_tot) if float(ss_tot) > 0 else 0.0
    return {"r2": r2, "slope": float(slope), "gap_to_identity": float((y - (1 - x)).abs().mean())}


@torch.no_grad()
def spatial_information(
    backbone: Backbone, site: str, channel: int, images01: torch.Tensor,
    fractions: Sequence[float] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0), threshold: float = 0.5, seed: int = 0,
) -> SpatialCurve:
    """Active-patch ratios of one unit on its images as active patches are removed.

    Args:
        backbone: a transformer (patch grid = token grid).
        site: token site of the unit, e.g. ``"blocks.4.mlp.post"``.
        channel: the unit's channel.
        images01: ``[B, 3, H, W]`` in [0, 1] at the model's input size (usually the unit's top images).
        fractions: fractions of the active patches to remove.
        threshold: activation above which a patch is active.
        seed: seed of the removal order.

    Returns:
        A :class:`SpatialCurve`.
    """
    if not backbone.spec.is_transformer:
        raise VitscopeValueError("the spatial-information test needs a transformer (one token per patch)")
    x = images01.float() / 255.0 if images01.dtype == torch.uint8 else images01.float()
    size = tuple(x.shape[-2:])
    grid = backbone.spec.grid_for(*size)
    fr = torch.tensor(list(fractions), dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    active0 = unit_maps(backbone, site, channel, x) > threshold  # [B, K]
    counts, sums, used = torch.zeros(len(fr), dtype=torch.float64), torch.zeros(len(fr), dtype=torch.float64), 0
    for img, act in zip(x, active0):
        n_active = int(act.sum())
        if n_active == 0:
            continue
        order = act.nonzero().flatten()[torch.randperm(n_active, generator=gen)]
        keep = act.unsqueeze(0).repeat(len(fr), 1)  # [F, K]: fraction 0 is the reference
        for i, f in enumerate(fr.tolist()):
            keep[i, order[: int(round(f * n_active))]] = False
        masked = img.unsqueeze(0) * patch_pixel_mask(keep, grid, size)  # black = 0 before normalisation
        maps = unit_maps(backbone, site, channel, masked)  # [F, K]
        on = maps > threshold
        count, total = on.sum(1).double(), (maps * on).sum(1)
        if count[0] == 0:
            continue
        counts += count / count[0]
        sums += total / total[0]
        used += 1
    if used == 0:
        nan = torch.full_like(fr, float("nan"))
        return SpatialCurve(fr, nan, nan.clone(), 0)
    return SpatialCurve(fr, counts / used, sums / used, used)


def spatial_information_by_block(
    backbone: Backbone, images01: torch.Tensor, channels: Sequence[int], blocks: Sequence[int] | None = None,
    site: str = "mlp.post", k: int = 5, fractions: Sequence[float] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
    threshold: float = 0.5, seed: int = 0,
) -> dict[str, torch.Tensor | list]:
    """Appendix F per block: for each unit, its ``k`` most-activating images among ``images01``.

    Args:
        backbone: a transformer.
        images01: ``[M, 3, H, W]`` candidate images (uint8 or [0, 1]).
        channels: channels tested in every block.
        blocks: blocks to test (default: all).
        site: block site (``"mlp.post"``: the FFN hidden activation).
        k, fractions, threshold, seed: as :func:`spatial_information`.

    Returns:
        ``fractions [F]``, ``count_ratio [L, F]``, ``sum_ratio [L, F]`` (mean over units with an active
        patch; NaN when none), ``units_used [L]``, ``blocks`` and per-block ``linearity`` dicts of the count curve.
    """
    x = images01.float() / 255.0 if images01.dtype == torch.uint8 else images01.float()
    blocks = list(range(backbone.spec.num_blocks)) if blocks is None else [int(b) for b in blocks]
    fr = torch.tensor(list(fractions), dtype=torch.float64)
    count, total, used = [], [], []
    for blk in blocks:
        name = f"blocks.{blk}.{site}"
        curves = []
        scores = unit_maps(backbone, name, list(channels), x).mean(1)  # [M, C]
        for j, c in enumerate(channels):
            top = scores[:, j].topk(min(k, len(scores))).indices
            curve = spatial_information(backbone, name, c, x[top], fractions, threshold, seed)
            if curve.images_used:
                curves.append(curve)
        used.append(len(curves))
        nan = torch.full_like(fr, float("nan"))
        count.append(torch.stack([cv.count_ratio for cv in curves]).mean(0) if curves else nan)
        total.append(torch.stack([cv.sum_ratio for cv in curves]).mean(0) if curves else nan)
    count_t, sum_t = torch.stack(count), torch.stack(total)
    return {"fractions": fr, "count_ratio": count_t, "sum_ratio": sum_t, "units_used": torch.tensor(used),
            "blocks": blocks,
            "linearity": [linearity(fr, c) if u else {} for c, u in zip(count_t, used)]}
