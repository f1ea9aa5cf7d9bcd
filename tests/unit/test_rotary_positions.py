"""DINOv3's rotary positions when tokens are left out: each kept spatial token keeps its own position.

Reference: the full forward with the dropped tokens masked out as keys (an additive -inf attention mask) gives
every kept token the output it has when the dropped tokens are not in the sequence at all (norms and MLP act per
token; a rotation depends only on the token's own place). So the outputs of ``run_kept`` on the kept tokens equal
the masked full forward at those tokens, and keeping every token equals the unmasked forward."""

from __future__ import annotations

import torch

from helpers.hf_factories import make, peaked
from vitscope import wrap
from vitscope.occlusion.forward import drop_tokens_logits


def _peaked_dinov3():
    return wrap(peaked(make("dinov3")), name="dinov3")


def _masked_full_forward(b, pixels: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Every block of the model with the dropped spatial tokens masked out as keys: ``[B, N, D]``."""
    tokens = b.embed(pixels)
    p = b.spec.num_prefix_tokens
    visible = torch.cat([torch.ones(len(pixels), p, dtype=torch.bool), keep], dim=1)  # [B, N]
    mask = torch.zeros(len(pixels), 1, tokens.shape[1], tokens.shape[1])
    mask.masked_fill_(~visible[:, None, None, :], float("-inf"))
    kw = b.family.layer_kwargs(b, tokens)
    for layer in b.layers:
        tokens = layer(tokens, attention_mask=mask, position_embeddings=kw["position_embeddings"])
    return tokens


def _kept(tokens: torch.Tensor, p: int, ids: torch.Tensor) -> torch.Tensor:
    """The prefix, then the spatial tokens at ``ids [B, K]``."""
    spatial = torch.gather(tokens[:, p:], 1, ids[..., None].expand(-1, -1, tokens.shape[-1]))
    return torch.cat([tokens[:, :p], spatial], dim=1)


def test_keeping_every_token_is_the_full_forward() -> None:
    b = _peaked_dinov3()
    x = torch.randn(2, 3, *b.spec.image_size)
    with torch.no_grad():
        tokens = b.embed(x)
        every = torch.arange(b.spec.num_spatial_tokens).expand(2, -1)
        torch.testing.assert_close(b.run_kept(tokens, every), b.run_blocks(tokens), atol=0, rtol=0)


def test_kept_tokens_keep_their_own_positions() -> None:
    b = _peaked_dinov3()
    torch.manual_seed(1)
    x = torch.randn(2, 3, *b.spec.image_size)
    k = b.spec.num_spatial_tokens
    keep = torch.zeros(2, k, dtype=torch.bool)
    keep[0, [0, 3, 5, 6, 9, 15]] = True
    keep[1, [1, 2, 4, 8, 12, 13]] = True
    p = b.spec.num_prefix_tokens
    with torch.no_grad():
        tokens = b.embed(x)
        ids = keep.nonzero()[:, 1].reshape(2, -1)
        got = b.run_kept(_kept(tokens, p, ids), ids)
        picked = _kept(_masked_full_forward(b, x, keep), p, ids)
        torch.testing.assert_close(got, picked, atol=1e-5, rtol=1e-5)
        first_places = torch.arange(ids.shape[1]).expand(2, -1)  # the wrong positions: the answer must differ
        wrong = b.run_kept(_kept(tokens, p, ids), first_places)
        assert (wrong - picked).abs().max() > 1e-3


def test_dropping_tokens_runs_with_their_positions() -> None:
    """The occlusion experiments' token dropping on DINOv3: nothing dropped equals the model's own output."""
    import transformers as tf

    model = tf.DINOv3ViTModel(make("dinov3").config)
    model.load_state_dict(make("dinov3").state_dict())
    b = wrap(model.eval(), name="dinov3")
    b.head = lambda tokens: tokens[:, 0]  # the CLS token stands in for a classifier's logits
    b.head_after_final_norm = True
    x = torch.randn(2, 3, *b.spec.image_size)
    nothing = torch.zeros(2, *b.spec.grid, dtype=torch.bool)
    with torch.no_grad():
        dropped_none = drop_tokens_logits(b, x, nothing)
        full = b.final_norm(b.run_blocks(b.embed(x)))[:, 0]
        torch.testing.assert_close(dropped_none, full, atol=1e-6, rtol=0)
        some = nothing.clone()
        some[:, 0, :] = True
        assert (drop_tokens_logits(b, x, some) - full).abs().max() > 0  # dropping changes the answer


def test_the_projections_before_rotation_are_recorded_too() -> None:
    """``attn.q`` / ``attn.k`` are what the kernel multiplies (rotated); ``attn.q_unrotated`` / ``k_unrotated`` the
    projections before: the prefix rows agree, the patch rows differ, and rotating the unrotated ones (the
    model's own rotation with the grid's cos and sin) gives the recorded ones."""
    from transformers.models.dinov3_vit.modeling_dinov3_vit import apply_rotary_pos_emb

    b = _peaked_dinov3()
    x = torch.randn(2, 3, *b.spec.image_size)
    names = ["blocks.1.attn.q", "blocks.1.attn.k", "blocks.1.attn.q_unrotated", "blocks.1.attn.k_unrotated"]
    with torch.no_grad(), b.record(names) as rec:
        b(x)
        cos, sin = b.family.layer_kwargs(b, b.embed(x))["position_embeddings"]
    q, k, q0, k0 = (rec[n] for n in names)
    p = b.spec.num_prefix_tokens
    assert q0.shape == q.shape == (2, b.spec.num_heads, b.spec.num_tokens, b.spec.embed_dim // b.spec.num_heads)
    torch.testing.assert_close(q0[:, :, :p], q[:, :, :p], atol=0, rtol=0)
    assert (q0[:, :, p:] - q[:, :, p:]).abs().max() > 1e-3
    rotated_q, rotated_k = apply_rotary_pos_emb(q0, k0, cos, sin)
    torch.testing.assert_close(rotated_q, q, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(rotated_k, k, atol=1e-6, rtol=1e-6)


def test_families_without_rotation_have_no_unrotated_names() -> None:
    import pytest

    from vitscope.hooks.names import UnknownHookError

    vit = wrap(make("vit"), name="vit")
    assert not any("unrotated" in n for n in vit.hook_names())
    with pytest.raises(UnknownHookError), vit.record("blocks.0.attn.q_unrotated"):
        pass
    assert "blocks.0.attn.q_unrotated" in _peaked_dinov3().hook_names()
