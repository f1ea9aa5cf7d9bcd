"""Ablations of a model's artifacts, each with its controls: the high-norm outlier tokens of a block's output
(chosen per image by their norm) and the register tokens, set to zero, to their mean over a reference set, or to
another image's tokens. Darcet et al. 2024 and Sun et al. 2024 found that zeroing registers or massive activations
breaks a model where their mean leaves it nearly intact: the conclusion flips with the control, so every ablation
here is read beside the others (:mod:`vitscope.functional.ablation`)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from vitscope.errors import VitscopeValueError
from vitscope.functional.ablation import MODES, replaced
from vitscope.hooks.edits import EditSet
from vitscope.interventions.edits import resample_source

__all__ = ["ablate_outliers"]


def ablate_outliers(hook: str, threshold: float, num_prefix: int, mode: str = "zero",
                    reference: Mapping[str, torch.Tensor] | None = None) -> EditSet:
    """Replace the patch tokens whose norm exceeds ``threshold`` at ``hook`` (e.g. ``blocks.2.resid_post``).

    Args:
        hook: a residual-stream name (``[B, N, D]``).
        threshold: the outlier norm (the artifacts analysis's ``thresholds``).
        num_prefix: prefix tokens (never replaced: ablate registers with
            :func:`~vitscope.interventions.ablate_tokens`).
        mode: ``"zero"``, ``"mean"`` (each position's mean over ``reference[hook]`` ``[N, D]``) or ``"resample"``
            (the same position of another image: the next of the batch, or of a recording ``reference[hook]``
            ``[R, N, D]``, image ``i`` taking ``(i + 1) mod R`` inside ``vitscope.run``).
        reference: as for :func:`~vitscope.interventions.ablate_tokens`.
    """
    if mode not in MODES:
        raise VitscopeValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not threshold > 0:
        raise VitscopeValueError(f"threshold must be a positive norm, got {threshold}")
    if mode == "mean" and (reference is None or hook not in reference):
        raise VitscopeValueError(f"mean ablation needs reference['{hook}'] (vitscope.interventions.reference_means)")

    def edit(t: torch.Tensor, name: str) -> torch.Tensor:
        outliers = t.float().norm(dim=-1) > threshold  # [B, N]
        outliers[:, :num_prefix] = False
        mean = reference.get(name) if mode == "mean" and reference is not None else None
        other = resample_source(reference, name, t) if mode == "resample" else None
        return replaced(t, (outliers,), mode, mean=mean, other=other)
    return EditSet({hook: edit})
