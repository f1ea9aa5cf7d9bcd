"""Dense features by tiling for any analysis the engine runs (paper 002 appendix B.4; docs/methods.md, Representations).

``wrap_tiled(backbone, scale=2)`` returns a :class:`TiledBackbone`: a Backbone whose preprocessing makes a
``scale`` times larger frame and whose forward runs the wrapped model on model-input-size tiles of that frame
(:func:`vitscope.functional.tiling.frame_plan`: tiles row-major, the last one along an axis shifted back to
the edge, first write wins). Inside ``record(names)`` every recorded tensor of a spatial site is stitched
back into the dense grid, so analyses fed by ``vitscope.run`` see one sequence per image on a
``scale`` times denser grid and read it through ``spec.grid`` / ``spec.grid_for`` as usual.

What can be stitched (documented contract):

- Per-token activations: ``embed``, ``blocks.{i}.resid_pre|norm1|attn_out|resid_mid|norm2|mlp.post|mlp_out|
  resid_post`` and ``final_norm`` (``[B, N, D]``): each spatial token depends on its own tile only, so it is
  placed at its position in the frame. CNN maps ``stages.{i}`` and ``features`` (``[B, C, h, w]``) likewise,
  each at its own stride.
- Not attention: ``blocks.{i}.attn.pattern`` and the ``attn.q|k|v`` it is computed from. A tile's tokens
  attend only within the tile; there is no attention between tokens of different tiles to report, so a
  stitched pattern would be invented. Recording them raises :class:`TilingError`.
- Prefix tokens (CLS, registers) are dropped: each tile has its own, none belongs to the frame. The tiled
  spec has ``num_prefix_tokens = 0``; analyses reading the CLS token must use the spatial mean instead.

Geometry: the frame is the model's preprocessing with the short side at ``scale`` times the model input
(``resize_size=None``), centre-cropped to ``scale`` times the input so that a batch has one frame size. The
feature-cache path (:class:`vitscope.models.views.TiledView`) keeps the whole long side instead, floored to
the patch size, exactly as B.4; for square images both give the same frame.

:func:`check_tiling` names every analysis that cannot run on tiled features (attention, CLS);
:func:`vitscope.engine.tiling.run_tiled` calls it before ``vitscope.run``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import torch

from vitscope.errors import VitscopeValueError
from vitscope.functional.tiling import TilingPlan, frame_plan, stitch_tiles
from vitscope.hooks.edits import Edits
from vitscope.hooks.names import ATTENTION_INTERNALS, expand_names, split_block_name
from vitscope.hooks.record import CallbackRemovable, Record, Removable
from vitscope.hooks.tokens import grid_to_tokens, tokens_to_grid
from vitscope.models.backbone import Backbone
from vitscope.models.spec import ModelSpec

__all__ = ["TiledBackbone", "TilingError", "check_tiling", "tiled_spec", "wrap_tiled"]


class TilingError(VitscopeValueError):
    """A tiled backbone was asked for something tiles cannot give (attention, CLS, staged execution)."""


def is_attention_hook(name: str) -> bool:
    """Whether ``name`` is an attention site (``blocks.{i}.attn.q|k|v|pattern|heads``), which cannot be stitched."""
    parts = split_block_name(name)
    return parts is not None and parts[1] in ATTENTION_INTERNALS


def tiled_spec(spec: ModelSpec, scale: float = 2.0) -> ModelSpec:
    """The spec a tiled backbone reports: frame ``scale`` x the input (floored to the patch), no prefix tokens.

    Args:
        spec: the wrapped model's spec.
        scale: frame side / model input side, >= 1 (the paper: 2).

    Returns:
        A spec with ``image_size`` the frame, ``grid`` its dense token grid (``grid_for`` unchanged: pixels
        // patch), ``num_prefix_tokens = 0``, ``resize_size = None`` (short side = the frame side) and no
        classifier head.
    """
    if not scale >= 1:
        raise TilingError(f"tiling scale must be >= 1 (frame side / model input side), got {scale!r}")
    p = spec.patch_size
    th, tw = spec.image_size
    if th % p or tw % p:
        raise TilingError(f"{spec.name}: the model input {spec.image_size} is not a multiple of its patch size {p}")
    frame = (int(scale * th) // p * p, int(scale * tw) // p * p)
    # one square frame per image, cut into square tiles of the model input: a token budget (images keeping their
    # aspect ratio, SigLIP 2 NaFlex) is the tiles' business, not the frame's
    return replace(spec, name=f"{spec.name}+tiled{scale:g}", image_size=frame, grid=spec.grid_for(*frame),
                   num_prefix_tokens=0, prefix_kinds=(), resize_size=None, has_head=False, max_tokens=None)


class TiledBackbone(Backbone):
    """Runs the wrapped backbone on tiles of a larger frame and stitches the recorded tokens (module docstring).

    Args:
        inner: the backbone to tile (transformer or CNN).
        scale: frame side / model input side (>= 1; the paper: 2).

    Attributes:
        inner: the wrapped backbone (use it for anything tiles cannot do: attention, staged execution).
        scale: the frame scale.
    """

    def __init__(self, inner: Backbone, scale: float = 2.0) -> None:
        if isinstance(inner, TiledBackbone):
            raise TilingError(f"{inner.spec.name} is already tiled; wrap the original backbone")
        super().__init__(inner.model, tiled_spec(inner.spec, scale))
        self.inner = inner
        self.scale = float(scale)
        self._active: list[tuple[Record, Record]] = []  # (inner record, stitched record) per open context

    @property
    def active_edits(self) -> tuple[Edits, ...]:
        """The open interventions of the wrapped backbone, whose model runs every tile."""
        return self.inner.active_edits

    # -- running -------------------------------------------------------------------------
    def forward(self, pixels: torch.Tensor, **kwargs: Any) -> Any:
        """Run the wrapped model on every tile of ``pixels [B, 3, H, W]``; stitch what open records hold.

        Returns:
            The wrapped model's own output on the ``[B*T, 3, th, tw]`` tiles (image-major: image b's tiles
            are rows ``b*T .. b*T + T-1``, in the plan's row-major order).
        """
        if pixels.dim() != 4:
            raise VitscopeValueError(f"pixels must be [B, 3, H, W], got {tuple(pixels.shape)}")
        b = pixels.shape[0]
        plan = frame_plan(tuple(pixels.shape[-2:]), self.inner.spec.image_size, self.spec.patch_size)
        th, tw = plan.tile
        tiles = torch.stack([pixels[:, :, t : t + th, c : c + tw] for t, c in plan.origins], dim=1)
        for inner_rec, _ in self._active:
            inner_rec.clear()  # a hook that did not fire must not leave a previous batch's tensor behind
        output = self.inner(tiles.flatten(0, 1), **kwargs)
        for inner_rec, outer in self._active:
            for name, value in inner_rec.as_dict().items():
                outer.put(name, self._stitch(name, value, plan, b))
        return output

    def _stitch(self, name: str, value: torch.Tensor, plan: TilingPlan, batch: int) -> torch.Tensor:
        """``[B*T, N, D]`` tokens -> ``[B, H/p * W/p, D]``; ``[B*T, C, h, w]`` maps -> ``[B, C, H/s, W/s]``."""
        spec = self.inner.spec
        num_tiles = len(plan.origins)
        if value.dim() == 3:
            grid = spec.grid_for(*plan.tile)
            if value.shape[1] != spec.num_prefix_tokens + grid[0] * grid[1]:
                raise TilingError(f"'{name}' has {value.shape[1]} tokens per tile, not {spec.num_prefix_tokens} "
                                  f"prefix + {grid[0]}x{grid[1]} spatial tokens: it cannot be stitched")
            maps = tokens_to_grid(value, grid, spec.num_prefix_tokens)  # [B*T, D, th/p, tw/p]
            dense = stitch_tiles(maps.reshape(batch, num_tiles, *maps.shape[1:]), plan)  # [B, D, H/p, W/p]
            return grid_to_tokens(dense)
        if value.dim() == 4:
            stride = plan.tile[0] // value.shape[-2] if value.shape[-2] else 0
            if stride < 1 or value.shape[-2] * stride != plan.tile[0] or value.shape[-1] * stride != plan.tile[1]:
                raise TilingError(f"'{name}' map {tuple(value.shape[-2:])} does not evenly cover a {plan.tile} tile")
            return stitch_tiles(value.reshape(batch, num_tiles, *value.shape[1:]), plan, stride)
        raise TilingError(f"'{name}' has shape {tuple(value.shape)}; only tokens [B, N, D] and maps [B, C, h, w] "
                          "can be stitched")

    # -- recording ----------------------------------------------------------------------
    def hook_names(self) -> list[str]:
        """The wrapped backbone's names; attention sites are refused at recording time with the reason."""
        return self.inner.hook_names()

    def _install(self, rec: Record) -> list[Removable]:
        refused = [n for n in rec.names if is_attention_hook(n)]
        if refused:
            shown = ", ".join(refused[:3]) + (f" and {len(refused) - 3} more" if len(refused) > 3 else "")
            raise TilingError(f"{self.spec.name} cannot record {shown}: a tile attends only within itself, so "
                              "attention over the stitched grid does not exist; run attention analyses without "
                              "tiling")
        context = self.inner.record(list(rec.names), detach=rec.detach)
        pair = (context.__enter__(), rec)
        self._active.append(pair)

        def close() -> None:
            self._active.remove(pair)
            context.__exit__(None, None, None)

        return [CallbackRemovable(close)]

    # -- staged execution: one model input at a time, so not on a tiled frame ------------
    def _staged(self) -> TilingError:
        return TilingError(f"{self.spec.name}: staged execution runs one model input, not a tiled frame; use "
                           "backbone.inner")

    def embed(self, pixels: torch.Tensor) -> torch.Tensor:
        raise self._staged()

    def run_blocks(self, tokens: torch.Tensor, start: int = 0, stop: int | None = None) -> torch.Tensor:
        raise self._staged()

    def final_norm(self, tokens: torch.Tensor) -> torch.Tensor:
        raise self._staged()

    # -- nn.Module conveniences ---------------------------------------------------------
    def to(self, *args: Any, **kwargs: Any) -> TiledBackbone:
        self.inner.to(*args, **kwargs)
        return self

    def eval(self) -> TiledBackbone:
        self.inner.eval()
        return self


def wrap_tiled(backbone: Backbone, scale: float = 2.0) -> TiledBackbone:
    """Dense features by tiling for every analysis run on the result (module docstring).

    Args:
        backbone: the backbone to tile.
        scale: frame side / model input side (>= 1; the paper: 2, a 2 x 2 grid of tiles per image).

    Returns:
        The :class:`TiledBackbone`; pass it to ``vitscope.run`` (or use
        :func:`vitscope.engine.tiling.run_tiled`, which also names analyses that cannot run tiled).
    """
    return TiledBackbone(backbone, scale)


def check_tiling(analyses: Iterable[Any], spec: ModelSpec) -> None:
    """Raise :class:`TilingError` naming the first analysis that cannot run on tiled features.

    Refused: analyses that record attention (``needs_attention``, or any ``attn.q|k|v|pattern`` hook), and
    analyses configured to read the CLS token (``tokens="cls"`` at image level): tiled sequences have none.

    Args:
        analyses: accumulator instances.
        spec: the spec of the wrapped (untiled) backbone or of the tiled one.
    """
    from vitscope.hooks.names import cnn_hook_names, transformer_hook_names

    valid = transformer_hook_names(spec.num_blocks) if spec.is_transformer else cnn_hook_names(spec.num_blocks)
    for a in analyses:
        name = getattr(a, "name", type(a).__name__)
        wanted: Sequence[str] = a.required_hooks(spec)
        try:
            hooks = expand_names(wanted, valid, spec.name)
        except KeyError:  # an unknown hook is the engine's error to report, with its own message
            hooks = []
        if getattr(a, "needs_attention", False) or any(is_attention_hook(h) for h in hooks):
            raise TilingError(f"analysis '{name}' reads attention, which tiling cannot provide (a tile attends only "
                              "within itself); run it without tiling")
        if getattr(a, "_cfg_tokens", None) == "cls" and getattr(a, "_cfg_level", "image") == "image":
            raise TilingError(f"analysis '{name}' reads the CLS token (tokens='cls'), which tiled features do not "
                              "have; configure it with tokens='spatial_mean'")
