"""BEiT's relative position bias follows the input's own grid, and a sequence of kept tokens takes it at their
own places.

Reference: every block of the model on the whole sequence with the dropped tokens masked out as keys (an additive
-inf attention mask on top of the model's own bias for the whole grid): a kept token's output does not depend on
whether the dropped tokens are in the sequence (norms and MLP act per token, the bias between two tokens depends
only on their places). So ``run_kept`` on the kept tokens equals that masked forward at those tokens."""

from __future__ import annotations

import pytest
import torch

from helpers.hf_factories import make, peaked
from vitscope import wrap
from vitscope.errors import VitscopeValueError
from vitscope.models.input_size import with_image_size
from vitscope.occlusion.forward import drop_tokens_logits

KINDS = ["beit", "beit-shared"]  # a bias in every block; one bias shared by the blocks


def _backbone(kind: str, side: int):
    b = wrap(peaked(make(kind)), name=kind)
    return b if side == b.spec.image_size[0] else with_image_size(b, side)


def _masked_full_forward(b, tokens: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Every block on the whole sequence ``[B, N, D]``, keys where ``visible [B, N]`` is False masked out."""
    mask = torch.zeros(len(tokens), 1, tokens.shape[1], tokens.shape[1])
    mask.masked_fill_(~visible[:, None, None, :], float("-inf"))
    kw = b.family.layer_kwargs(b, tokens)
    bias = mask if kw["attention_mask"] is None else kw["attention_mask"] + mask
    for layer in b.layers:
        tokens = layer(tokens, **{**kw, "attention_mask": bias})
    return tokens


def _pick(tokens: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return torch.gather(tokens, 1, index[..., None].expand(-1, -1, tokens.shape[-1]))


@pytest.mark.parametrize("side", [32, 48])  # the model's own size; another one (bias and positions interpolated)
@pytest.mark.parametrize("kind", KINDS)
def test_kept_tokens_take_the_bias_at_their_own_places(kind, side) -> None:
    b = _backbone(kind, side)
    x = torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(1))
    k = b.spec.num_spatial_tokens
    keep = torch.zeros(2, k, dtype=torch.bool)
    keep[0, [0, 3, 5, 6, 9, 15]] = True
    keep[1, [1, 2, 4, 8, 12, 13]] = True
    ids = keep.nonzero()[:, 1].reshape(2, -1)  # [B, 6]
    with torch.no_grad():
        tokens = b.embed(x)
        index = torch.cat([torch.zeros(2, 1, dtype=torch.long), ids + 1], dim=1)  # CLS, then the kept tokens
        got = b.run_kept(_pick(tokens, index), ids)
        visible = torch.cat([torch.ones(2, 1, dtype=torch.bool), keep], dim=1)
        reference = _pick(_masked_full_forward(b, tokens, visible), index)
        torch.testing.assert_close(got, reference, atol=1e-5, rtol=1e-5)
        # patches without the CLS token (token mixing's isolated patches)
        alone = b.run_kept(_pick(tokens, ids + 1), ids)
        visible[:, 0] = False
        torch.testing.assert_close(alone, _pick(_masked_full_forward(b, tokens, visible), ids + 1), atol=1e-5,
                                   rtol=1e-5)
        first_places = torch.arange(ids.shape[1]).expand(2, -1)  # the wrong places: the answer must differ
        assert (b.run_kept(_pick(tokens, index), first_places) - reference).abs().max() > 1e-3


@pytest.mark.parametrize("kind", KINDS)
def test_keeping_every_token_is_the_full_forward(kind) -> None:
    b = _backbone(kind, 32)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        tokens = b.embed(x)
        every = torch.arange(b.spec.num_spatial_tokens).expand(2, -1)
        torch.testing.assert_close(b.run_kept(tokens, every), b.run_blocks(tokens), atol=1e-6, rtol=0)


def test_a_subset_without_its_places_is_refused() -> None:
    b = _backbone("beit", 32)
    with torch.no_grad():
        tokens = b.embed(torch.randn(1, 3, 32, 32))
        with pytest.raises(VitscopeValueError, match=r"made for the 4x4 grid of the last input \(17 tokens\), but "
                                                     r"the blocks got 15 tokens; run a subset of them with run_kept"):
            b.run_blocks(tokens[:, :15])


@pytest.mark.parametrize("side", [32, 48])
def test_dropping_tokens_on_beit(side) -> None:
    """The occlusion experiments' token dropping: nothing dropped is the model's own logits, some dropped is the
    classifier on the masked forward's kept tokens."""
    b = _backbone("beit", side)
    x = torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(0))
    nothing = torch.zeros(2, *b.spec.grid, dtype=torch.bool)
    some = nothing.clone()
    some[:, 0, :2] = True
    with torch.no_grad():
        torch.testing.assert_close(drop_tokens_logits(b, x, nothing), b(x).logits, atol=1e-5, rtol=0)
        tokens = b.embed(x)
        visible = torch.cat([torch.ones(2, 1, dtype=torch.bool), ~some.flatten(1)], dim=1)
        kept = _masked_full_forward(b, tokens, visible)[visible].reshape(2, -1, tokens.shape[-1])
        torch.testing.assert_close(drop_tokens_logits(b, x, some), b.head(kept), atol=1e-5, rtol=0)


def test_staged_blocks_after_a_forward_read_its_grid() -> None:
    """Blocks run on tokens recorded by a forward (head importance) use that forward's grid, not the one of an
    earlier embed: a 2x8 input has as many tokens as the 4x4 one."""
    b = wrap(peaked(make("beit")), name="beit")
    wide = torch.randn(2, 3, 16, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        b.embed(torch.randn(1, 3, 32, 32))
        with b.record(["blocks.0.resid_pre", "blocks.1.resid_post"]) as rec:
            b(wide)
            recorded = {name: t.clone() for name, t in rec.items()}
        torch.testing.assert_close(b.run_blocks(recorded["blocks.0.resid_pre"]), recorded["blocks.1.resid_post"],
                                   atol=1e-5, rtol=0)
