"""Interventions through an SAE's latents, for :meth:`vitscope.Backbone.intervene`, each with its control:
steering along a latent's decoder direction beside a random direction of the same norm, and ablating latents in the
reconstruction (the SAE's error kept, so that only the latents change) beside the reconstruction untouched."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vitscope.autoencoders.model import SparseAutoencoder
from vitscope.autoencoders.tokens import as_tokens, is_map, map_back, selected_tokens
from vitscope.errors import VitscopeValueError
from vitscope.hooks.edits import EditSet

__all__ = ["ablate_latents", "random_direction", "steer_latent"]


def _check(sae: SparseAutoencoder, latents: Sequence[int]) -> list[int]:
    chosen = sorted({int(i) for i in latents})
    bad = [i for i in chosen if not 0 <= i < sae.d_sae]
    if bad or not chosen:
        raise VitscopeValueError(f"latents {bad or list(latents)} are not latents of this SAE (0 to {sae.d_sae - 1})")
    return chosen


def _fits(t: torch.Tensor, sae: SparseAutoencoder, name: str) -> bool:
    """Whether ``t`` is a CNN map (else tokens ``[..., d_in]``); an SAE of another width is refused in one line."""
    if is_map(t, sae.d_in):
        return True
    if t.shape[-1] != sae.d_in:
        raise VitscopeValueError(f"the SAE reads {sae.d_in} channels, but '{name}' has {t.shape[-1]} "
                                 f"(shape {list(t.shape)}): an SAE edits the site it was trained on")
    return False


def steer_latent(sae: SparseAutoencoder, hook: str, latent: int, scale: float,
                 direction: torch.Tensor | None = None) -> EditSet:
    """Add ``scale * W_dec[latent]`` (in the activations' units; or ``scale * direction``) to every token at ``hook``
    (of a CNN's ``[B, C, H, W]`` map: to every position's channels).

    Args:
        sae: the autoencoder; hook: where it reads.
        latent: the latent whose decoder row is the direction; scale: its multiple.
        direction: another ``[d_in]`` direction instead (e.g. :func:`random_direction`, the control).
    """
    chosen = _check(sae, [latent])[0]
    if sae.token_norm is not None and direction is None:
        raise VitscopeValueError("this SAE normalises every token (token_norm): a latent's direction has no fixed "
                                 "size in the activations' units; pass direction=")
    vector = (sae.W_dec[chosen] / sae.scale).detach() if direction is None else direction.detach()
    if vector.shape != (sae.d_in,):
        raise VitscopeValueError(f"a direction of {sae.d_in} values is needed, got {tuple(vector.shape)}")

    def edit(t: torch.Tensor, name: str) -> torch.Tensor:
        step = (scale * vector).to(t.device, t.dtype)
        return t + (step[:, None, None] if _fits(t, sae, name) else step)
    return EditSet({hook: edit})


def random_direction(sae: SparseAutoencoder, latent: int, seed: int = 0) -> torch.Tensor:
    """A random ``[d_in]`` direction with the norm of ``latent``'s steering direction: the control of steering."""
    reference = (sae.W_dec[_check(sae, [latent])[0]] / sae.scale).detach()
    direction = torch.randn(sae.d_in, generator=torch.Generator().manual_seed(int(seed)))
    return direction / direction.norm() * reference.norm()


def ablate_latents(sae: SparseAutoencoder, hook: str, latents: Sequence[int], prefix_kinds: Sequence[str],
                   tokens_of: str | None = None) -> EditSet:
    """Replace the SAE's tokens at ``hook`` by ``x - decode(codes) + decode(codes with latents zeroed)``: the
    latents' contribution removed, everything the SAE does not explain kept. With no latent active the tokens are
    unchanged (the control is the same edit with other latents, or none).

    Args:
        sae: the autoencoder; hook: where it reads; latents: those to remove.
        prefix_kinds: the model's prefix tokens (``backbone.spec.prefix_kinds``; none for a CNN, whose
            ``[B, C, H, W]`` map has a token per position).
        tokens_of: which tokens are edited (default: those the SAE was trained on, as its file records them, else
            ``"spatial"``).
    """
    chosen = _check(sae, latents)
    kinds = tuple(prefix_kinds)
    tokens_of = tokens_of or getattr(sae, "tokens_of", None) or "spatial"

    def edit(t: torch.Tensor, name: str) -> torch.Tensor:
        if _fits(t, sae, name):
            return map_back(on_tokens(as_tokens(t)), t)
        return on_tokens(t)

    def on_tokens(t: torch.Tensor) -> torch.Tensor:
        out = t.clone()
        x = selected_tokens(t.float(), kinds, tokens_of)
        model = sae.to(t.device)
        codes = model.encode(x)
        kept = codes.clone()
        kept[:, chosen] = 0
        change = model.reconstruct(kept, x) - model.reconstruct(codes, x)  # only the latents' share goes
        p = len(kinds)
        if tokens_of == "spatial":
            out[:, p:] = (t[:, p:].float() + change.reshape(t[:, p:].shape)).to(t.dtype)
        elif tokens_of == "all":
            out = (t.float() + change.reshape(t.shape)).to(t.dtype)
        else:
            wanted = [i for i, kind in enumerate(kinds) if kind == ("cls" if tokens_of == "cls" else "reg")]
            out[:, wanted] = (t[:, wanted].float() + change.reshape(t[:, wanted].shape)).to(t.dtype)
        return out
    return EditSet({hook: edit})
