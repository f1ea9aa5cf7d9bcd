"""Artifacts planted in a small ViT by editing its weights: ground truth for the artifact diagnostics
(docs/artifacts.md).

Small models do not grow high-norm tokens on their own, so :func:`plant_artifacts` builds them into a timm-layout ViT
(the zoo's tiny ViTs) with a few exact edits:

1. a *tag*: one residual dimension (``tag_dim``) that nothing writes but the position embeddings, which hold
   ``tag`` at the chosen patch positions and 0 elsewhere;
2. an MLP unit (``unit`` of ``block``) that reads only the tag (through the block's second LayerNorm) and fires only
   where it is set, writing ``strength`` into a few *massive* dimensions (``massive_dims``), which nothing else
   writes or reads: from that block's output on, the tagged tokens have norms far above the others and entries far
   above the median (high-norm outliers and massive activations, Darcet et al. 2024, Sun et al. 2024);
3. a *sink head* (``sink_head`` of ``sink_block``, after ``block``) whose query is a constant and whose key reads
   only the first massive dimension: every query, the CLS token's included, attends to the outliers.

The clean twin (``tagged=False``) gets every edit but the tag: the unit never fires, and nothing stands out.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from vitscope.errors import VitscopeValueError

__all__ = ["PLANTED_NAMES", "PlantedArtifacts", "plant_artifacts", "planted_model", "planted_pair"]

#: registered model names: the planted model and its clean twin (defaults of :class:`PlantedArtifacts`)
PLANTED_NAMES = {"tiny-vit-planted": True, "tiny-vit-planted-clean": False}


@dataclass(frozen=True)
class PlantedArtifacts:
    """Where the artifacts are (what the diagnostics must find).

    Attributes:
        positions: patch indices (row-major on the model's grid) of the outlier tokens.
        block: the first block whose output holds them; unit: the MLP unit of ``block`` that writes them.
        sink_block, sink_head: the head whose CLS attention goes to them.
        tag_dim: the residual dimension of the tag; massive_dims: the dimensions of the massive activations.
        tagged: whether the tag is set (False: the clean twin).
    """

    positions: tuple[int, ...] = (0, 7, 56)
    block: int = 2
    unit: int = 0
    sink_block: int = 4
    sink_head: int = 1
    tag_dim: int = 127
    massive_dims: tuple[int, ...] = (125, 126)
    tagged: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


def _check(model: nn.Module, truth: PlantedArtifacts) -> None:
    """Refuse what cannot be planted in ``model``, before any edit so that a refused model is left as it was
    (negative indices included: Python would read them from the end, and the truth would not say where)."""
    blocks = getattr(model, "blocks", None)
    if blocks is None or not hasattr(model, "pos_embed") or not hasattr(blocks[0], "mlp"):
        raise VitscopeValueError("plant_artifacts edits a timm-layout ViT (pos_embed, blocks[i].attn.qkv, "
                                 "blocks[i].mlp.fc1/fc2), such as the zoo's tiny ViTs")
    depth, dim = len(blocks), model.pos_embed.shape[-1]
    if not 0 <= truth.block < truth.sink_block < depth:
        raise VitscopeValueError(f"need 0 <= block < sink_block < {depth}, got {truth.block}, {truth.sink_block}")
    heads, units = blocks[truth.sink_block].attn.num_heads, blocks[truth.block].mlp.fc1.out_features
    if not 0 <= truth.sink_head < heads:
        raise VitscopeValueError(f"need 0 <= sink_head < {heads} (the heads of block {truth.sink_block}), got "
                                 f"{truth.sink_head}")
    if not 0 <= truth.unit < units:
        raise VitscopeValueError(f"need 0 <= unit < {units} (the MLP units of block {truth.block}), got {truth.unit}")
    dims = (truth.tag_dim, *truth.massive_dims)
    if not truth.massive_dims or len(set(dims)) != len(dims) or not all(0 <= d < dim for d in dims):
        raise VitscopeValueError(f"tag_dim and at least one massive dimension must be distinct dimensions below "
                                 f"{dim}, got tag_dim {truth.tag_dim} and massive_dims {truth.massive_dims}")
    patches = model.pos_embed.shape[1] - 1
    if not truth.positions or not all(0 <= p < patches for p in truth.positions):
        raise VitscopeValueError(f"positions must be patch indices below {patches}, got {truth.positions}")


@torch.no_grad()
def plant_artifacts(model: nn.Module, truth: PlantedArtifacts = PlantedArtifacts(), tag: float = 4.0,
                    strength: float = 100.0, sharpness: float = 10.0) -> PlantedArtifacts:
    """Edit ``model`` in place so that it holds the artifacts of ``truth`` (or, untagged, is their clean twin).

    Args:
        model: a timm-layout ViT (``pos_embed`` ``[1, 1 + K, D]``, ``blocks[i].attn.qkv``, ``.mlp.fc1/fc2``).
        truth: where to plant them.
        tag: the tag's value in the position embeddings (a few times a coordinate's usual size: the tagged tokens
            are not outliers before ``truth.block``).
        strength: weight of the unit's output into each massive dimension.
        sharpness: the unit's input weight on the (normalised) tag; its bias keeps it off where the tag is 0.

    Returns:
        ``truth``.
    """
    _check(model, truth)
    silent = [truth.tag_dim, *truth.massive_dims]
    model.cls_token[..., silent] = 0.0
    model.pos_embed[..., silent] = 0.0
    if truth.tagged:
        model.pos_embed[0, [1 + p for p in truth.positions], truth.tag_dim] = tag
    proj = model.patch_embed.proj
    proj.weight[silent] = 0.0
    if proj.bias is not None:
        proj.bias[silent] = 0.0
    for block in model.blocks:
        for writer in (block.attn.proj, block.mlp.fc2):  # nothing writes the tag or the massive dimensions ...
            writer.weight[silent] = 0.0
            writer.bias[silent] = 0.0
        block.attn.qkv.weight[:, truth.massive_dims] = 0.0  # ... nor reads the massive ones
        block.mlp.fc1.weight[:, truth.massive_dims] = 0.0
    writer = model.blocks[truth.block]
    writer.norm2.weight[truth.tag_dim], writer.norm2.bias[truth.tag_dim] = 1.0, 0.0
    writer.mlp.fc1.weight[truth.unit] = 0.0
    writer.mlp.fc1.weight[truth.unit, truth.tag_dim] = sharpness
    writer.mlp.fc1.bias[truth.unit] = -sharpness * tag / 2
    writer.mlp.fc2.weight[:, truth.unit] = 0.0
    writer.mlp.fc2.weight[list(truth.massive_dims), truth.unit] = strength
    _sink(model.blocks[truth.sink_block], truth)
    return truth


def _sink(block: nn.Module, truth: PlantedArtifacts) -> None:
    """One head whose query is constant and whose key reads the first massive dimension."""
    dim = block.attn.qkv.in_features
    head_dim = dim // block.attn.num_heads
    rows = slice(truth.sink_head * head_dim, (truth.sink_head + 1) * head_dim)
    q, k = block.attn.qkv.weight[:dim], block.attn.qkv.weight[dim : 2 * dim]
    q_bias, k_bias = block.attn.qkv.bias[:dim], block.attn.qkv.bias[dim : 2 * dim]
    q[rows], k[rows], q_bias[rows], k_bias[rows] = 0.0, 0.0, 0.0, 0.0
    q_bias[rows.start] = 4.0 * head_dim ** 0.5
    k[rows.start, truth.massive_dims[0]] = 4.0
    block.norm1.weight[truth.massive_dims[0]], block.norm1.bias[truth.massive_dims[0]] = 1.0, 0.0


def planted_model(tagged: bool = True, base: str = "tiny-vit-sup", truth: PlantedArtifacts = PlantedArtifacts(),
                  name: str | None = None, **edits: float):
    """The zoo model ``base`` with the artifacts of ``truth`` planted (``tagged``) or its clean twin, named ``name``
    (default ``<base>-planted`` / ``<base>-clean``; ``load_model("tiny-vit-planted")`` and
    ``"tiny-vit-planted-clean"`` name them so)."""
    import dataclasses

    from vitscope.models.load import load_model

    backbone = load_model(base)
    plant_artifacts(backbone.model, dataclasses.replace(truth, tagged=tagged), **edits)
    backbone.spec = dataclasses.replace(backbone.spec, name=name or f"{base}-{'planted' if tagged else 'clean'}")
    return backbone


def planted_pair(base: str = "tiny-vit-sup", truth: PlantedArtifacts = PlantedArtifacts(), **edits: float):
    """A zoo model with the artifacts of ``truth`` planted, and its clean twin (every edit but the tag).

    Args:
        base: the zoo model to edit; truth: where; edits: :func:`plant_artifacts`'s ``tag``, ``strength``,
            ``sharpness``.

    Returns:
        ``(planted backbone, clean backbone, truth)``; their specs are named ``<base>-planted`` and ``<base>-clean``.
    """
    return planted_model(True, base, truth, **edits), planted_model(False, base, truth, **edits), truth
