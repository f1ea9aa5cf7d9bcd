"""Which tokens of a hook a sparse autoencoder reads: the spatial tokens, the class token, the registers, or all."""

from __future__ import annotations

import torch

from vitscope.errors import VitscopeUsageError

__all__ = ["TOKENS_OF", "as_tokens", "check_selects", "is_map", "map_back", "selected_tokens"]

#: which tokens of a hook an SAE sees
TOKENS_OF = ("spatial", "cls", "registers", "all")


def selected_tokens(x: torch.Tensor, kinds: tuple[str, ...], tokens_of: str) -> torch.Tensor:
    """The tokens ``[n, D]`` of a hook's ``[B, T, D]`` that the SAE reads."""
    p = len(kinds)
    if tokens_of == "all":
        return x.reshape(-1, x.shape[-1])
    if tokens_of == "spatial":
        return x[:, p:].reshape(-1, x.shape[-1])
    wanted = [i for i, kind in enumerate(kinds) if kind == ("cls" if tokens_of == "cls" else "reg")]
    return x[:, wanted].reshape(-1, x.shape[-1])


def as_tokens(x: torch.Tensor) -> torch.Tensor:
    """A CNN's map ``[B, C, H, W]`` as tokens ``[B, H*W, C]``: every position is a token of ``C`` channels."""
    return x.flatten(2).transpose(1, 2)


def map_back(tokens: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Tokens ``[B, H*W, C]`` (:func:`as_tokens`) back into the layout of the map ``like`` ``[B, C, H, W]``."""
    return tokens.transpose(1, 2).reshape(like.shape)


def is_map(x: torch.Tensor, d_in: int) -> bool:
    """Whether an edited tensor is a CNN's map ``[B, C, H, W]`` of an SAE's ``d_in`` channels rather than tokens
    ``[..., d_in]`` (an edit is not told the model: its channels decide)."""
    return x.dim() == 4 and x.shape[1] == d_in and x.shape[-1] != d_in


def check_selects(kinds: tuple[str, ...], tokens_of: str, model: str) -> None:
    """Refuse a choice of tokens that a model with prefix tokens ``kinds`` never has (a class token or registers it
    lacks), before any pass: an SAE would read nothing.

    Raises:
        VitscopeUsageError: ``cls`` without a class token, ``registers`` without registers (one line).
    """
    if tokens_of in ("cls", "registers") and ("cls" if tokens_of == "cls" else "reg") not in kinds:
        what = "class token" if tokens_of == "cls" else "registers"
        raise VitscopeUsageError(f"{model} has no {what}: tokens_of {tokens_of!r} selects no token (spatial or all "
                                 "read its tokens)")
