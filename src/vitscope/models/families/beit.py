"""BEiT: relative position bias (per block, or shared) that every block receives with its resolution.

The bias is made for the grid of the last input run (``backbone.last_input_hw``: the last ``embed`` or forward),
never guessed from the number of tokens (a 2x8 and a 4x4 grid have as many). A sequence of kept spatial tokens
(:meth:`~vitscope.models.backbone.Backbone.run_kept`) takes each bias at the kept tokens' places on that grid.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from vitscope.errors import VitscopeValueError
from vitscope.models.entry import ModelEntry
from vitscope.models.families._common import INCEPTION
from vitscope.models.family import HFFamily, register_family


def _window(backbone: Any) -> tuple[tuple[int, int], tuple[int, int], int]:
    """``(resolution, window, tokens)`` of the last input: its pixels, its patch grid, its whole sequence."""
    spec = backbone.spec
    hw = (int(backbone.last_input_hw[0]), int(backbone.last_input_hw[1]))
    window = (hw[0] // spec.patch_size, hw[1] // spec.patch_size)
    return hw, window, spec.num_prefix_tokens + window[0] * window[1]


def _kept_index(backbone: Any, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``[B, M]`` places on the whole sequence of the ``M`` tokens of ``tokens``: its prefix tokens (all or
    none of them), then the spatial tokens at ``positions [B, K]`` (row-major on the grid)."""
    p = backbone.spec.num_prefix_tokens
    prefix = tokens.shape[1] - positions.shape[1]
    if prefix not in (0, p):
        raise VitscopeValueError(f"{backbone.spec.name}: {tokens.shape[1]} tokens for {positions.shape[1]} kept "
                                 f"positions; a sequence holds all {p} prefix tokens or none")
    head = torch.arange(prefix, device=positions.device).expand(len(positions), -1)
    return torch.cat([head, positions.long() + p], dim=1)


def _at_kept(bias: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``bias [1, H, N, N]`` between every pair of the whole sequence -> ``[B, H, M, M]`` between the pairs of
    ``index [B, M]``."""
    index = index.to(bias.device)
    b, h, m, n = len(index), bias.shape[1], index.shape[1], bias.shape[-1]
    rows = bias.expand(b, -1, -1, -1).gather(2, index[:, None, :, None].expand(b, h, m, n))
    return rows.gather(3, index[:, None, None, :].expand(b, h, m, m))


def _layer_kwargs(backbone: Any, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> dict[str, Any]:
    """What ``BeitModel.forward`` hands each layer for the last input: its resolution and the shared relative
    position bias; with ``positions [B, K]`` (kept spatial tokens) the bias between the kept tokens' places."""
    hw, window, whole = _window(backbone)
    if positions is None and tokens.shape[1] != whole:
        raise VitscopeValueError(f"{backbone.spec.name}: BEiT's relative position bias is made for the "
                                 f"{window[0]}x{window[1]} grid of the last input ({whole} tokens), but the blocks "
                                 f"got {tokens.shape[1]} tokens; run a subset of them with run_kept(tokens, positions)")
    interpolate = hw != backbone.native_image_size
    # kept tokens: the layers make their bias for the whole sequence (resizing it to the kept count would blur it)
    kw: dict[str, Any] = {"resolution": hw, "interpolate_pos_encoding": interpolate and positions is None,
                          "attention_mask": None}
    shared = getattr(backbone.base, "shared_position_bias", None)
    if shared is not None:
        bias = shared(window, interpolate_pos_encoding=interpolate, dim_size=whole)
        kw["attention_mask"] = bias if positions is None else _at_kept(bias, _kept_index(backbone, tokens, positions))
    return kw


@contextmanager
def _kept_layers(backbone: Any, tokens: torch.Tensor, positions: torch.Tensor) -> Iterator[None]:
    """Each block's own relative position bias, made for the whole sequence, taken at the places of ``tokens``
    (prefix, then the spatial tokens at ``positions [B, K]``) while the context is open."""
    index = _kept_index(backbone, tokens, positions)

    def at_kept(module: torch.nn.Module, args: Any, bias: torch.Tensor) -> torch.Tensor:
        return _at_kept(bias, index)

    handles = [layer.relative_position_bias.register_forward_hook(at_kept) for layer in backbone.layers
               if getattr(layer, "relative_position_bias", None) is not None]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _head(backbone: Any, tokens: torch.Tensor) -> torch.Tensor:
    return backbone.model.classifier(backbone.base.pooler(tokens))


FAMILY = register_family(HFFamily(
    name="beit",
    preprocessing={"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "interpolation": "bicubic"},
    head=_head,
    layer_kwargs=_layer_kwargs,
    kept_layers=_kept_layers,
    aliases=(
        ModelEntry("beit-b16", "beit", 12, 12, 768, 16, ("cls",), "microsoft/beit-base-patch16-224",
                   {**INCEPTION, "interpolation": "bicubic"}),
    ),
))
