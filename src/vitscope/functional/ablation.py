"""Replacements of parts of an activation, the controls of an ablation (pure tensor maths; the interventions that
apply them are :mod:`vitscope.interventions`).

An ablation means nothing alone: zeroing a component puts the model off its input distribution, so every ablation
is read beside its controls (Heimersheim and Nanda 2024; on registers, Darcet et al. 2024 and Jiang et al. 2025
found zeroing costs tens of points where mean replacement costs about one):

- ``"zero"``: the part set to 0;
- ``"mean"``: the part set to its mean over a reference set (per token position);
- ``"resample"``: the part taken from another image (by default the next image of the batch, cyclically);
- ``"noise"`` (tokens): Gaussian noise with the standard deviation of every token position and channel over a
  reference set of images (or, without one, over the batch, which must then hold two images or more).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vitscope.errors import VitscopeValueError

__all__ = ["MODES", "TOKEN_MODES", "replaced", "rolled"]

MODES: tuple[str, ...] = ("zero", "mean", "resample")
TOKEN_MODES: tuple[str, ...] = (*MODES, "noise")


def rolled(x: torch.Tensor) -> torch.Tensor:
    """Every image's tensor taken from the next image of the batch (the last from the first): ``x.roll(1, 0)``
    reversed, so image ``j`` receives image ``j + 1``'s."""
    if x.shape[0] < 2:
        raise VitscopeValueError("resampling takes another image's activations: it needs a batch of two images or "
                                 "more, or a reference")
    return torch.roll(x, shifts=-1, dims=0)


def replaced(x: torch.Tensor, index: tuple, mode: str, mean: torch.Tensor | None = None,
             other: torch.Tensor | None = None, generator: torch.Generator | None = None,
             draws: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` with ``x[index]`` replaced by the ``mode``'s values (a new tensor; ``x`` is untouched).

    Args:
        x: ``[B, ...]`` an activation.
        index: what to replace, as a tuple indexing ``x`` (e.g. ``(slice(None), [2, 5])``: heads 2 and 5 of
            ``[B, H, N, Dh]``).
        mode: one of :data:`TOKEN_MODES`.
        mean: ``"mean"``: the reference mean of one image's tensor, ``x.shape[1:]``.
        other: ``"resample"``: the tensors to take the part from, ``x``'s shape (default :func:`rolled` ``x``);
            ``"noise"``: ``[R, ...]`` reference images whose standard deviation over ``R`` scales the noise
            (default: ``x``'s over its batch).
        generator: ``"noise"``: the random generator (unless ``draws`` are given).
        draws: ``"noise"``: standard normal values of ``x``'s shape to scale (default drawn from ``generator``).
    """
    if mode not in TOKEN_MODES:
        raise VitscopeValueError(f"ablation mode must be one of {', '.join(TOKEN_MODES)}, got {mode!r}")
    out = x.clone()
    if mode == "zero":
        out[index] = 0
    elif mode == "mean":
        if mean is None:
            raise VitscopeValueError("mean ablation needs the reference mean (reference=...)")
        if tuple(mean.shape) != tuple(x.shape[1:]):
            raise VitscopeValueError(f"the reference mean has shape {tuple(mean.shape)}, but one image's tensor has "
                                     f"{tuple(x.shape[1:])} (images of another size or grid?)")
        out[index] = mean.to(x.dtype).to(x.device).expand_as(x)[index]
    elif mode == "resample":
        source = rolled(x) if other is None else other.to(x.device, x.dtype)
        if source.shape != x.shape:
            raise VitscopeValueError(f"resampled activations have shape {tuple(source.shape)}, not {tuple(x.shape)}")
        out[index] = source[index]
    else:
        spread = x if other is None else other.to(x.device)
        if spread.shape[0] < 2 or tuple(spread.shape[1:]) != tuple(x.shape[1:]):
            raise VitscopeValueError(f"noise takes each token's standard deviation over two images or more (a "
                                     f"reference recording [R, ...] of one image's shape {tuple(x.shape[1:])}, or "
                                     f"the batch), got {tuple(spread.shape)}")
        std = spread.float().std(dim=0, keepdim=True).expand_as(x)
        if draws is None:
            draws = torch.randn(x.shape, generator=generator, device="cpu")
        elif tuple(draws.shape) != tuple(x.shape):
            raise VitscopeValueError(f"noise draws have shape {tuple(draws.shape)}, not {tuple(x.shape)}")
        noise = draws.to(x.device) * std
        out[index] = noise.to(x.dtype)[index]
    return out


def head_index(heads: Sequence[int], num_heads: int) -> tuple:
    """The index of heads ``heads`` in ``[B, H, N, Dh]`` (checked against ``num_heads``)."""
    bad = [h for h in heads if not 0 <= int(h) < num_heads]
    if bad:
        raise VitscopeValueError(f"heads {bad} do not exist: the block has {num_heads} heads (0 to {num_heads - 1})")
    return (slice(None), [int(h) for h in heads])
