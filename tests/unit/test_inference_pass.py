"""A pass leaves a Hugging Face model usable for gradients: per-grid tensors its classes cache are not left as
inference tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vitscope
from helpers.hf_factories import make
from vitscope.models.inference import forget_cached_tensors


@pytest.mark.parametrize("kind", ["beit", "beit-shared"])
def test_after_a_pass_a_forward_with_gradients_works(kind: str) -> None:
    """BEiT cached its relative position index made in inference mode: any later backward failed."""
    backbone = vitscope.wrap(make(kind), name=kind)
    images = [np.full((32, 32, 3), 40 * i, dtype=np.uint8) for i in range(2)]
    vitscope.run(backbone, images, ["attention_stats"], batch_size=2, progress=False, workers=0)
    pixels = backbone.preprocess(images).requires_grad_(True)
    out = backbone.model(pixel_values=pixels)
    torch.as_tensor(out[0]).float().sum().backward()
    assert pixels.grad is not None and bool(torch.isfinite(pixels.grad).all())


def test_the_caches_found_are_the_classes_own() -> None:
    backbone = vitscope.wrap(make("beit"), name="beit")
    assert forget_cached_tensors(backbone.model) >= 1  # the relative position index's cache
    assert forget_cached_tensors(torch.nn.Linear(2, 2)) == 0


def test_a_model_in_training_mode_is_in_it_again_after_a_pass() -> None:
    """The pass left it in eval mode: a user alternating training and analysis lost dropout without a word."""
    backbone = vitscope.load_model("tiny-vit")
    backbone.model.train()
    images = [np.full((32, 32, 3), 40 * i, dtype=np.uint8) for i in range(2)]
    seen = []
    vitscope.run(backbone, images, ["attention_stats"], batch_size=2, progress=False, workers=0)
    seen.append(backbone.model.training)
    backbone.model.eval()
    vitscope.run(backbone, images, ["attention_stats"], batch_size=2, progress=False, workers=0)
    assert seen == [True] and not backbone.model.training


def test_each_module_keeps_its_own_mode() -> None:
    """The whole model was set to its top module's mode: a frozen (eval) part of a model in training came back
    in training mode."""
    backbone = vitscope.load_model("tiny-vit")
    backbone.model.train()
    frozen = backbone.model.patch_embed
    frozen.eval()
    before = {name: m.training for name, m in backbone.model.named_modules()}
    images = [np.full((32, 32, 3), 40 * i, dtype=np.uint8) for i in range(2)]
    vitscope.run(backbone, images, ["attention_stats"], batch_size=2, progress=False, workers=0)
    assert {name: m.training for name, m in backbone.model.named_modules()} == before
    assert not frozen.training and backbone.model.training
