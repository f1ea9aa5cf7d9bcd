"""Faithfulness of paired maps: deletion and insertion curves (beyond paper 000).

For a pair (a, b), patches of image a are removed (deletion: replaced by the baseline, 0 in the model's
normalisation, i.e. the dataset mean colour) or revealed (insertion: starting from the all-baseline image)
in the order of a map, most important first; the curve is the cosine similarity of the perturbed a with
the unperturbed b. The same curves in a random order and in the order of the output-agnostic rollout map
are the baselines: a faithful paired map deletes faster (smaller deletion area) and inserts faster (larger
insertion area) than both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from vitscope.attribution.faithfulness import Faithfulness
from vitscope.errors import VitscopeValueError
from vitscope.explain.paired import PairedSimilarity
from vitscope.functional.faithfulness import (
    MODES,
    curve_area,
    patch_order,
    patch_pixel_mask,
    perturbation_schedule,
    random_order,
    step_fractions,
)

__all__ = ["FaithfulnessCurves", "faithfulness_curves"]


#: the curves of paired maps: the same record as an attribution's (one order and mode each)
FaithfulnessCurves = Faithfulness


@torch.no_grad()
def faithfulness_curves(
    explainer: PairedSimilarity, images_a: Any, images_b: Any, maps: Mapping[str, torch.Tensor],
    steps: int | None = None, random_seed: int = 0, modes: tuple[str, ...] = MODES,
) -> FaithfulnessCurves:
    """Deletion and insertion curves of image a's patches against image b, for several patch orders.

    Args:
        explainer: gives the embeddings (``explainer.embed``).
        images_a: the images perturbed (any input ``explainer.encode`` accepts), B of them.
        images_b: their partners (unperturbed), B of them.
        maps: ``{name: [B, h, w]}`` maps of image a whose order is tested (e.g. ``{"paired": out.map_a,
            "rollout": out.rollout_a}``); a ``"random"`` order (seeded) is always added.
        steps: curve steps (default: one per patch).
        random_seed: seed of the random order.
        modes: ``("deletion", "insertion")`` or one of them.

    Returns:
        :class:`FaithfulnessCurves`.
    """
    xa, xb = explainer.pixels(images_a), explainer.pixels(images_b)
    if len(xa) != len(xb):
        raise VitscopeValueError(f"need as many first as second images, got {len(xa)} and {len(xb)}")
    if not maps:
        raise VitscopeValueError("give at least one map to order the patches by")
    grid = tuple(next(iter(maps.values())).shape[-2:])
    k = grid[0] * grid[1]
    steps = k if steps is None else steps
    orders = {name: patch_order(m.reshape(len(xa), *grid)) for name, m in maps.items()}
    orders["random"] = random_order(len(xa), k, torch.Generator().manual_seed(random_seed))
    eb = explainer.embed(xb)  # [B, E]
    result = FaithfulnessCurves(step_fractions(k, steps))
    for name, order in orders.items():
        result.curves[name], result.areas[name] = {}, {}
        for mode in modes:
            keep = perturbation_schedule(order, steps, mode)  # [B, S+1, K]
            mask = patch_pixel_mask(keep.flatten(0, 1), grid, tuple(xa.shape[-2:]))  # [B*(S+1), 1, H, W]
            perturbed = xa.repeat_interleave(steps + 1, 0) * mask  # baseline 0 = the mean colour
            ea = explainer.embed(perturbed)
            curve = torch.cosine_similarity(ea, eb.repeat_interleave(steps + 1, 0), dim=-1).view(len(xa), steps + 1)
            result.curves[name][mode] = curve
            result.areas[name][mode] = curve_area(curve, result.fractions).float()
    return result
