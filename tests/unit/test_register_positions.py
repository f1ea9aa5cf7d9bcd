"""A test-time register on a timm ViT whose position embeddings cover its prefix tokens (``no_embed_class=False``:
timm's original ViT and DeiT). The module below follows ``VisionTransformer._pos_embed`` of timm
(``timm/models/vision_transformer.py``: prefix tokens concatenated, then one position embedding per token added;
with ``dynamic_img_size`` the embeddings resampled by ``num_prefix_tokens``; then ``pos_drop``), rewritten here
because timm cannot be imported beside this torch."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vitscope import wrap
from vitscope.interventions import registers
from vitscope.models.tiny import TinyViT, TinyViTConfig


class OriginalTimmViT(TinyViT):
    """timm's ``no_embed_class=False`` convention: a position embedding for every prefix token too."""

    no_embed_class = False

    def __init__(self, registers: int = 0, global_pool: str = "avg") -> None:
        super().__init__(TinyViTConfig(depth=2, num_reg_tokens=registers, global_pool=global_pool, num_classes=3))
        h, w = self.patch_embed.grid_size
        self.pos_embed = nn.Parameter(torch.randn(1, self.num_prefix_tokens + h * w, 128) * 0.02)
        self.pos_drop = nn.Dropout(0.0)
        self.counts: list[int] = []  # num_prefix_tokens as each embedding saw it

    def _pos_embed(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, d = x.shape
        self.counts.append(self.num_prefix_tokens)
        prefix_pos, grid_pos = self.pos_embed[:, :self.num_prefix_tokens], self.pos_embed[:, self.num_prefix_tokens:]
        gh, gw = self.patch_embed.grid_size
        grid_pos = F.interpolate(grid_pos.reshape(1, gh, gw, d).permute(0, 3, 1, 2), size=(h, w), mode="bicubic",
                                 align_corners=False).permute(0, 2, 3, 1).reshape(1, h * w, d)
        prefix = [self.cls_token.expand(b, -1, -1)] + ([self.reg_token.expand(b, -1, -1)] if self.reg_token is not
                                                         None else [])
        x = torch.cat(prefix + [x.reshape(b, h * w, d)], dim=1) + torch.cat([prefix_pos, grid_pos], dim=1)
        return self.pos_drop(x)


@pytest.mark.parametrize("trained", [0, 2])
def test_the_register_comes_after_the_position_embeddings(trained: int) -> None:
    backbone = wrap(OriginalTimmViT(trained).eval(), name="timm-original")
    p = backbone.spec.num_prefix_tokens
    assert p == 1 + trained
    registered = registers.with_test_time_register(backbone)
    assert registered.spec.prefix_kinds == ("cls",) + ("reg",) * (trained + 1)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        before, after = backbone.embed(x), registered.embed(x)
    assert after.shape[1] == before.shape[1] + 1
    assert torch.all(after[:, p] == 0)  # a zero token, with no position embedding
    assert torch.equal(after[:, :p], before[:, :p]) and torch.equal(after[:, p + 1:], before[:, p:])
    m = registered.model
    assert m.num_prefix_tokens == p + 1 and backbone.model.num_prefix_tokens == p
    with torch.no_grad():
        tokens = registered.run_blocks(after)
        pooled = m.forward_head(m.norm(tokens), pre_logits=True)
    assert torch.allclose(pooled, m.norm(tokens)[:, p + 1:].mean(dim=1))  # avg pooling skips the register


def test_another_input_size_resamples_by_the_models_own_prefix_even_in_a_copy() -> None:
    """The embeddings are resampled with the count of the model's own prefix tokens (one more would take a patch's
    embedding for the register's and fail on the sizes); a deep copy's hooks act on the copy."""
    registered = registers.with_test_time_register(wrap(OriginalTimmViT(1).eval(), name="timm-original"))
    twin = copy.deepcopy(registered)
    with torch.no_grad():
        out = twin(torch.randn(2, 3, 96, 80))
    assert out.shape == (2, 3)
    assert twin.model.counts[-1] == 2 and twin.model.num_prefix_tokens == 3
    assert registered.model.counts == [2]  # only the check run by with_test_time_register: the twin's are its own


def test_the_register_neurons_move_onto_it() -> None:
    backbone = wrap(OriginalTimmViT().eval(), name="timm-original")
    registered, edits = registers.test_time_register(backbone, {0: [0, 1]})
    with torch.no_grad(), registered.intervene(edits), registered.record(["blocks.0.mlp.post"]) as rec:
        registered(torch.randn(2, 3, 64, 64))
        act = rec["blocks.0.mlp.post"].clone()
    assert act.shape[1] == 2 + 64
    assert torch.all(act[:, 2:, :2] == 0) and torch.all(act[:, 1, 0] == act[:, 1, 1]) and torch.all(act[:, 1, 0] != 0)


def test_without_a_pos_drop_it_refuses_in_one_line() -> None:
    model = OriginalTimmViT().eval()
    del model.pos_drop
    model._pos_embed = lambda x: x.reshape(x.shape[0], -1, x.shape[-1])
    with pytest.raises(ValueError, match="no_embed_class=False.*no pos_drop module"):
        registers.with_test_time_register(wrap(model, name="timm-original"))
