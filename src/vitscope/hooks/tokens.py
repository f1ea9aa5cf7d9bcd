"""Token-layout helpers: prefix tokens first, spatial tokens row-major (docs/methods.md, Shared rules)."""

from __future__ import annotations

import torch

from vitscope.errors import VitscopeValueError


def tokens_to_grid(tokens: torch.Tensor, grid: tuple[int, int], num_prefix: int) -> torch.Tensor:
    """Reshape the spatial tokens of a sequence into a feature map.

    Args:
        tokens: ``[B, N, D]`` with ``N = num_prefix + h * w``.
        grid: ``(h, w)``; non-square grids are fine.
        num_prefix: prefix tokens (CLS, distillation, registers) to drop first.

    Returns:
        ``[B, D, h, w]`` where ``out[b, :, r, c] = tokens[b, num_prefix + r * w + c]``.
    """
    h, w = grid
    b, n, d = tokens.shape
    if n - num_prefix != h * w:
        raise VitscopeValueError(f"{n} tokens minus {num_prefix} prefix tokens do not fill a {h}x{w} grid")
    return tokens[:, num_prefix:].reshape(b, h, w, d).permute(0, 3, 1, 2)


def grid_to_tokens(fmap: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`tokens_to_grid` for the spatial part: ``[B, D, h, w] -> [B, h*w, D]``."""
    b, d, h, w = fmap.shape
    return fmap.permute(0, 2, 3, 1).reshape(b, h * w, d)


def site_units(x: torch.Tensor, num_prefix: int, transformer: bool, name: str = "the site") -> torch.Tensor:
    """Every channel of a recorded site at its spatial positions, row-major: ``-> [B, K, C]``.

    Args:
        x: tokens ``[B, N, D]`` (``C = D``), a transformer's attention tensors ``[B, H, N, Dh]`` (channels the
            concatenated heads, ``C = H * Dh``) or a CNN map ``[B, C, h, w]``.
        num_prefix: prefix tokens to drop (transformers).
        transformer: whether a 4-d ``x`` is attention tensors (True) or a CNN map (False).
        name: the site, for the message.
    """
    if x.dim() == 3:
        return x[:, num_prefix:]
    if x.dim() == 4 and transformer:
        b, heads, _, dh = x.shape
        return x[:, :, num_prefix:].permute(0, 2, 1, 3).reshape(b, -1, heads * dh)
    if x.dim() == 4:
        return grid_to_tokens(x)
    raise VitscopeValueError(f"{name}: expected tokens [B, N, D], attention tensors [B, H, N, Dh] or a map "
                             f"[B, C, h, w], got {tuple(x.shape)}")
