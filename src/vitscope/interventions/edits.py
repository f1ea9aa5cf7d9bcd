"""Ready-made edits: head and token ablations with their controls, activation patching and steering. Each returns
the ``{hook: fn(tensor, name) -> tensor}`` mapping :meth:`vitscope.Backbone.intervene` takes."""

from __future__ import annotations

import fnmatch
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from vitscope.errors import VitscopeValueError
from vitscope.functional.ablation import MODES, TOKEN_MODES, head_index, replaced
from vitscope.functional.keyed_seeds import keyed_generator
from vitscope.hooks.edits import EditSet, images_running, tiles_running

__all__ = ["EditSet", "ablate_heads", "ablate_tokens", "patch", "steer"]


def _reference_of(reference: Mapping[str, torch.Tensor] | None, name: str, what: str) -> torch.Tensor:
    if reference is None or name not in reference:
        raise VitscopeValueError(f"{what} needs reference['{name}'] (vitscope.interventions.reference_means for a "
                                 "mean, a recording of other images for resampling)")
    return reference[name]


def resample_source(reference: Mapping[str, torch.Tensor] | None, name: str, t: torch.Tensor) -> torch.Tensor | None:
    """Other images' tensors to resample from, or None (the next image of the batch).

    ``reference[name]`` counts when it holds images (``[R, ...]``; a mean, one image's shape, does not). Inside
    ``vitscope.run`` (:func:`~vitscope.hooks.edits.images_running` knows the images' dataset indices) image ``i``
    takes reference image ``(i + 1) mod R``, never itself when the reference is the data's first images, so no
    number depends on the batch; elsewhere the reference is taken row for row, as the caller's batch.
    """
    held = reference.get(name) if reference is not None else None
    if held is None or held.dim() != t.dim():
        return None
    running = images_running()
    if running is None or len(running) != t.shape[0]:
        return held
    if held.shape[0] < 2:
        raise VitscopeValueError(f"resampling '{name}' takes another image's tensors: the reference holds one image; "
                                 "give two or more")
    return held[torch.as_tensor([(i + 1) % held.shape[0] for i in running])]


def _noise_spread(reference: Mapping[str, torch.Tensor] | None, name: str, t: torch.Tensor) -> torch.Tensor | None:
    """The images whose spread scales the noise: every reference image ``[R, ...]``, or None (the batch)."""
    held = reference.get(name) if reference is not None else None
    return held if held is not None and held.dim() == t.dim() else None


def _image_draws(seed: int, name: str, indices: Sequence[int], shape: torch.Size,
                 tiles: Sequence[int] | None = None) -> torch.Tensor:
    """Standard normal draws ``[B, ...]``, image ``i``'s from a generator of its own seeded by (seed, hook, dataset
    index, and its tile where a view cuts images into tiles), so an image's noise is the same whatever batch it
    comes in and however many forwards ran before, and no two tiles of an image share their noise."""
    rows = []
    for row, i in enumerate(indices):
        tile = tiles[row] if tiles is not None else 0
        generator = keyed_generator(int(seed), name, int(i), *((int(tile),) if tile else ()))
        rows.append(torch.randn(tuple(shape[1:]), generator=generator))
    return torch.stack(rows)


def ablate_heads(heads: Mapping[int, Sequence[int]], mode: str = "zero",
                 reference: Mapping[str, torch.Tensor] | None = None) -> EditSet:
    """Replace the output of some heads (``blocks.{i}.attn.heads``, before the output projection).

    Args:
        heads: block -> the heads to ablate in it.
        mode: ``"zero"``, ``"mean"`` (the head's mean output per token position over a reference set) or
            ``"resample"`` (another image's output: the next image of the batch, or ``reference``).
        reference: ``"mean"``: ``{"blocks.{i}.attn.heads": [H, N, Dh]}``
            (:func:`~vitscope.interventions.reference_means`); ``"resample"``: optionally
            ``{"blocks.{i}.attn.heads": [B, H, N, Dh]}`` recorded on other images (a mean is ignored there, so
            one reference serves every control).
    """
    if mode not in MODES:
        raise VitscopeValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not isinstance(heads, Mapping):
        raise VitscopeValueError(f"heads maps each block to the heads to ablate in it ({{3: [0, 5]}}), got {heads!r}")
    edits = EditSet()
    for block, chosen in heads.items():
        name = f"blocks.{_integer(block, 'a block')}.attn.heads"
        if isinstance(chosen, (str, bytes)) or not isinstance(chosen, (Sequence, torch.Tensor, range)):
            raise VitscopeValueError(f"heads[{block!r}] must list the heads to ablate ([0, 5]), got {chosen!r}")
        chosen = [_integer(h, f"a head of block {block}") for h in chosen]
        if mode == "mean":
            _reference_of(reference, name, "mean ablation")

        def edit(t: torch.Tensor, n: str, _heads: list[int] = chosen) -> torch.Tensor:
            mean = reference[n] if mode == "mean" else None
            other = resample_source(reference, n, t) if mode == "resample" else None
            return replaced(t, head_index(_heads, t.shape[1]), mode, mean=mean, other=other)
        edits[name] = edit
    return edits


def _integer(value: Any, what: str) -> int:
    """``value`` as an int; 1.5, "a" or True are refused in one line (``int`` would cut or parse them)."""
    if isinstance(value, torch.Tensor) and value.dim() == 0:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise VitscopeValueError(f"{what} is an integer, got {value!r}")
    return int(value)


def _token_index(tokens: Any) -> tuple:
    """Token indices (a list, or a bool mask ``[N]`` / ``[B, N]``) as an index of ``[B, N, ...]``; positions that
    are not integers (1.5 would be cut to 1), or a mask of more than two dimensions, are refused in one line."""
    if isinstance(tokens, torch.Tensor) and tokens.dtype == torch.bool:
        if tokens.dim() not in (1, 2):
            raise VitscopeValueError(f"a token mask is [N] or [B, N], got shape {tuple(tokens.shape)}")
        return (tokens,) if tokens.dim() == 2 else (slice(None), tokens)
    try:
        listed = tokens.reshape(-1).tolist() if isinstance(tokens, torch.Tensor) else list(tokens)
    except TypeError:
        raise VitscopeValueError(f"tokens are a list of positions or a bool mask, got {tokens!r}") from None
    bad = [i for i in listed if isinstance(i, bool) or not isinstance(i, numbers.Integral)]
    if bad:
        raise VitscopeValueError(f"token positions are integers (or a bool mask), got {bad[0]!r}")
    return (slice(None), [int(i) for i in listed])


def _checked(index: tuple, t: torch.Tensor, name: str) -> tuple:
    """``index`` (of :func:`_token_index`) checked against the tensor it edits, ``[B, N, D]``."""
    if t.dim() != 3:  # per-head tensors [B, H, N, Dh] or CNN maps: dimension 1 is no token axis
        raise VitscopeValueError(f"'{name}' is {list(t.shape)}, not tokens [B, N, D]: token edits take the residual "
                                 "stream, norms and MLP sites (for heads, ablate_heads)")
    n = t.shape[1]
    if isinstance(index[-1], list):
        bad = [i for i in index[-1] if not -n <= i < n]
        if bad:
            raise VitscopeValueError(f"token positions {bad} do not exist: '{name}' has {n} tokens (0 to {n - 1})")
    else:
        mask = index[-1]
        want = (n,) if len(index) == 2 else (t.shape[0], n)
        if tuple(mask.shape) != want:
            raise VitscopeValueError(f"the token mask has shape {tuple(mask.shape)}, but '{name}' needs "
                                     f"{list(want)} (its batch of {t.shape[0]} images, {n} tokens)")
    return index


def ablate_tokens(tokens: Any, mode: str = "zero", hooks: Sequence[str] | str = "embed",
                  reference: Mapping[str, torch.Tensor] | None = None, seed: int = 0) -> EditSet:
    """Replace some tokens of the residual stream (every position of the sequence counts: prefix tokens first).

    Args:
        tokens: positions in the sequence (a list of integers), or a bool mask ``[N]`` (every image) or ``[B, N]``;
            checked against the edited tensor when the edit runs.
        mode: ``"zero"``, ``"mean"`` (per position, over a reference set), ``"resample"`` (another image's) or
            ``"noise"`` (Gaussian with the standard deviation of each token position and channel over all the
            reference images, or over the batch without them; seeded: inside ``vitscope.run``, where
            :func:`~vitscope.hooks.edits.images_running` knows the images, each image's draws come from ``seed``,
            the hook and its dataset index, so they depend on neither the batch nor earlier forwards; elsewhere
            from one generator seeded once, drawn on at every forward).
        hooks: where (default ``embed``: the tokens entering block 0); names, not patterns.
        reference: as for :func:`ablate_heads`, keyed by the hooks; ``"noise"``: a recording ``[R, N, D]`` of other
            images, so the noise's scale does not depend on the batch (without it a batch needs two images).
        seed: the noise's seed.
    """
    if mode not in TOKEN_MODES:
        raise VitscopeValueError(f"mode must be one of {', '.join(TOKEN_MODES)}, got {mode!r}")
    index = _token_index(tokens)
    names = [hooks] if isinstance(hooks, str) else list(hooks)
    generator = torch.Generator().manual_seed(int(seed))
    for name in names:
        if mode == "mean":
            _reference_of(reference, name, "mean ablation")

    def edit(t: torch.Tensor, n: str) -> torch.Tensor:
        mean = reference[n] if mode == "mean" else None
        at = _checked(index, t, n)
        if mode != "noise":
            other = resample_source(reference, n, t) if mode == "resample" else None
            return replaced(t, at, mode, mean=mean, other=other)
        running = images_running()
        tiles = tiles_running()
        draws = (_image_draws(seed, n, running, t.shape, tiles if tiles and len(tiles) == len(running) else None)
                 if running is not None and len(running) == t.shape[0] else None)
        return replaced(t, at, mode, other=_noise_spread(reference, n, t), generator=generator, draws=draws)
    return EditSet({name: edit for name in names})


def patch(recorded: Mapping[str, torch.Tensor], hooks: Sequence[str] | str | None = None) -> EditSet:
    """Activation patching: put the tensors recorded on one input into the run of another.

    Args:
        recorded: ``{name: tensor}`` of a recording (``backbone.record``) of the source run, e.g. the clean one
            (patched into the corrupted run) or the corrupted one (patched into the clean run).
        hooks: which of the recorded names to patch (names or glob patterns; default: all of them).
    """
    patterns = [hooks] if isinstance(hooks, str) else list(hooks) if hooks is not None else ["*"]
    names = [n for n in recorded if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    if not names:
        raise VitscopeValueError(f"nothing to patch: no recorded name matches {patterns} (recorded: "
                                 f"{sorted(recorded)[:6]})")
    saved = {n: recorded[n].detach().clone() for n in names}
    return EditSet({n: (lambda t, name: saved[name]) for n in names})


def steer(hook: str, direction: torch.Tensor, scale: float = 1.0, tokens: Any = None) -> EditSet:
    """Add ``scale * direction`` to the tensor at ``hook``.

    Args:
        hook: a canonical name (e.g. ``blocks.6.resid_post``).
        direction: ``[D]`` (every token) or ``[N, D]`` (per position).
        scale: its multiple.
        tokens: only these positions (a list or a bool mask, as :func:`ablate_tokens`); default every token.
    """
    direction = torch.as_tensor(direction).detach()
    if direction.dim() not in (1, 2):
        raise VitscopeValueError(f"a steering direction is [D] or [N, D], got shape {list(direction.shape)}")
    index = None if tokens is None else _token_index(tokens)

    def edit(t: torch.Tensor, n: str) -> torch.Tensor:
        if tuple(direction.shape) != tuple(t.shape[-direction.dim():]):
            raise VitscopeValueError(f"the steering direction is {list(direction.shape)}, but '{n}' is "
                                     f"{list(t.shape)}: it needs [{t.shape[-1]}] or {list(t.shape[-2:])}")
        add = (scale * direction).to(t.device, t.dtype).expand_as(t)
        if index is None:
            return t + add
        out = t.clone()
        at = _checked(index, t, n)
        out[at] = t[at] + add[at]
        return out
    return EditSet({hook: edit})
