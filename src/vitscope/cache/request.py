"""What the feature cache keeps per image (:class:`FeatureRequest`) and how tokens are pooled into it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vitscope.errors import VitscopeValueError
from vitscope.functional.pooling import mask_pool
from vitscope.models.views import TokenGroup

__all__ = ["POOLINGS", "FeatureRequest", "pool_group"]

POOLINGS = ("cls", "spatial_mean", "spatial", "all", "mask")


#: the block sites whose tokens ``[B, N, D]`` a request pools
TOKEN_SITES: tuple[str, ...] = ("resid_pre", "norm1", "attn_out", "resid_mid", "norm2", "mlp_out", "resid_post")


@dataclass(frozen=True)
class FeatureRequest:
    """Which features to keep for every image (one cache entry per request).

    Attributes:
        site: block site, ``blocks.{i}.<site>``: ``"resid_post"`` (block output), ``"norm1"``, ``"norm2"``,
            ``"resid_pre"``, ``"resid_mid"``, ``"attn_out"`` or ``"mlp_out"``.
        pooling: ``"cls"`` ``[D]``; ``"spatial_mean"`` ``[D]``; ``"spatial"`` ``[K, D]`` (row-major grid);
            ``"all"`` ``[N*D]``; ``"mask"``: one row ``[D]`` per region mask of the image (mask-weighted mean
            of the spatial tokens; extra columns ``label`` and ``region``).
        blocks: block indices to keep; None = every block.
    """

    site: str = "resid_post"
    pooling: str = "cls"
    blocks: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise VitscopeValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if self.blocks is not None:
            object.__setattr__(self, "blocks", tuple(int(b) for b in self.blocks))

    def block_list(self, num_blocks: int) -> list[int]:
        """The blocks this request keeps on a model with ``num_blocks`` blocks (negative indices count back; a block
        named twice, as ``5`` and ``-1`` of six, is kept once)."""
        if self.blocks is None:
            return list(range(num_blocks))
        outside = [b for b in self.blocks if not -num_blocks <= b < num_blocks]
        if outside:
            raise VitscopeValueError(f"block{'s' if len(outside) > 1 else ''} {', '.join(map(str, outside))} outside "
                                     f"0..{num_blocks - 1} (or -{num_blocks}..-1 counting from the last)")
        return sorted({b % num_blocks for b in self.blocks})

    def hooks(self, num_blocks: int) -> list[str]:
        return [f"blocks.{i}.{self.site}" for i in self.block_list(num_blocks)]


def pool_group(group: TokenGroup, hook: str, pooling: str, weights: list[torch.Tensor] | None = None) -> torch.Tensor:
    """Pool one hook's tokens of a group: ``[b, F]`` (``[b, K, D]`` for "spatial"; for "mask" ``[sum M_i, D]``).

    Args:
        group: tokens of b images sharing a layout.
        hook: the hook name.
        pooling: one of :data:`POOLINGS`.
        weights: for "mask", one ``[M_i, K]`` weight matrix per image of the group.
    """
    x = group.tokens[hook]
    p = group.num_prefix
    if pooling == "cls":
        if p < 1:
            raise VitscopeValueError("pooling 'cls' needs a CLS token; these features have none (a model without one, "
                                     "or tiled features): use 'spatial_mean'")
        return x[:, 0]
    if pooling == "spatial_mean":
        return x[:, p:].mean(dim=1)
    if pooling == "spatial":
        return x[:, p:]
    if pooling == "all":
        return x.reshape(x.shape[0], -1)
    if weights is None:
        raise VitscopeValueError("pooling 'mask' needs region weights")
    rows = [mask_pool(x[j, p:].double(), w.to(x.device)) for j, w in enumerate(weights)]
    return torch.cat(rows) if rows else x.new_zeros((0, x.shape[-1]))
