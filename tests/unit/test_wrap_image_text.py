"""``vitscope.wrap`` of a whole image-text model refuses it in one line: its forward needs text, and the tower found
first may be the text one (a CLIP model was refused for its text tower's missing norm, an AIMv2 model accepted and
then failed at the first forward)."""

from __future__ import annotations

import pytest
import torch
import transformers as tf

import vitscope
from vitscope.errors import VitscopeTypeError

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)


@pytest.mark.parametrize("build", [
    lambda: tf.Aimv2Model(tf.Aimv2Config(vision_config=dict(SMALL, image_size=32, patch_size=8),
                                         text_config=dict(SMALL))),
    lambda: tf.CLIPModel(tf.CLIPConfig(vision_config=dict(SMALL, image_size=32, patch_size=8),
                                       text_config=dict(SMALL))),
], ids=["aimv2", "clip"])
def test_an_image_text_model_asks_for_its_vision_tower(build):
    model = build()
    with pytest.raises(VitscopeTypeError, match=r"an image-text model: wrap its vision tower \(model.vision_model\)"):
        vitscope.wrap(model)
    tower = vitscope.wrap(model.vision_model, name="tower")  # what the message asks for works
    with torch.no_grad():
        assert tower(torch.randn(1, 3, 32, 32)) is not None
