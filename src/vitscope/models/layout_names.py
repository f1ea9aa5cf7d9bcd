"""The module names of a Hugging Face family's blocks, as data its descriptor can change (no torch here).

Every family here computes ``x + scale1 * attn(norm1(x))`` then ``+ scale2 * mlp(norm2(.))``; :class:`HFLayout`
names the modules that hold those pieces. Its defaults are the names of the transformers 5.x families that follow
the ViT layout (ViT, DeiT, DINO, DINOv2, CLIP and SigLIP towers, ViT-MAE, BEiT, I-JEPA), so most descriptors say
nothing; a family with other names (AIMv2's ``rms_norm1`` and ``ffn``, DINOv3's ``model.layer``) says them in its
own file.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HFLayout"]


@dataclass(frozen=True)
class HFLayout:
    """Module names of one family (each a tuple of candidates, tried in order).

    Attributes:
        blocks: dotted paths, from the module holding ``embeddings``, of the ``nn.ModuleList`` of blocks.
        norm1, norm2: the pre-attention and pre-MLP norms inside a block.
        attention: the attention module inside a block (its kernel call is what vitscope records).
        q_proj, k_proj: the query and key projections inside ``attention`` (``attn.q_unrotated`` /
            ``attn.k_unrotated`` of a family whose blocks rotate them).
        o_proj: the output projection inside ``attention``; its input is ``attn.heads``.
        mlp: the MLP inside a block (its output is the MLP branch).
        mlp_out: the MLP's output projection inside ``mlp``; its input is ``mlp.post`` (for a gated MLP,
            SwiGLU, the product of the gate's activation and the up projection).
        layer_scale: modules after the attention and after the MLP that scale their branch (absent: none).
        final_norm: the norm after the last block, on the module holding ``embeddings``.
        final_norm_on_sequence: the model applies the final norm to every token (CLIP: to the pooled CLS only;
            vitscope then applies it to every token for ``final_norm``).
    """

    blocks: tuple[str, ...] = ("layers", "encoder.layer", "encoder.layers")
    norm1: tuple[str, ...] = ("layernorm_before", "norm1", "layer_norm1")
    norm2: tuple[str, ...] = ("layernorm_after", "norm2", "layer_norm2")
    attention: tuple[str, ...] = ("attention", "self_attn")
    q_proj: tuple[str, ...] = ("q_proj", "query")
    k_proj: tuple[str, ...] = ("k_proj", "key")
    o_proj: tuple[str, ...] = ("o_proj", "out_proj")
    mlp: tuple[str, ...] = ("mlp",)
    mlp_out: tuple[str, ...] = ("fc2", "weights_out", "down_proj")
    layer_scale: tuple[str, str] = ("layer_scale1", "layer_scale2")
    final_norm: tuple[str, ...] = ("layernorm", "norm", "post_layernorm")
    final_norm_on_sequence: bool = True
