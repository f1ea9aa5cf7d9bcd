"""The cascading randomisation check: a map that ignores the model fails it, a gradient map passes it, and the
trained model is left untouched."""

from __future__ import annotations

import pytest
import torch

import vitscope
from vitscope.attribution import attribute
from vitscope.attribution.sanity import cascading_randomisation

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_map_of_the_image_alone_fails_and_a_gradient_map_passes():
    model = vitscope.load_model("tiny-vit-sup")
    pixels = torch.randn(3, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    before = {k: v.clone() for k, v in model.model.state_dict().items()}
    edges = cascading_randomisation(model, lambda b: pixels.abs().mean(1))  # the image, whatever the model
    assert edges.steps == ["head"] + [f"block {i}" for i in range(5, -1, -1)]
    assert torch.allclose(edges.correlation, torch.ones_like(edges.correlation)) and not edges.passes
    gradients = cascading_randomisation(model, lambda b: attribute(b, pixels, 1, "token_gradcam"))
    assert gradients.passes and gradients.final < 0.5, gradients.correlation
    assert all(torch.equal(before[k], v) for k, v in model.model.state_dict().items())
