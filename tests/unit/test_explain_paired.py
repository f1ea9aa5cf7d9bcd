"""PairedSimilarity on real backbones: exact sums, rollout redistribution, CNNs, cached explanations."""

import pytest
import torch

from vitscope.explain import PairedSimilarity
from vitscope.models.wrap import build_tiny_resnet, build_tiny_vit


@pytest.fixture(scope="module")
def pixels():
    return torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def vit():
    return build_tiny_vit("v", image_size=32, depth=2, embed_dim=32, num_heads=2, num_classes=8, global_pool="avg")


def test_raw_maps_sum_to_the_embedding_cosine(vit, pixels):
    ps = PairedSimilarity(vit, projection="head")
    out = ps.explain(pixels[:2], pixels[2:])
    with torch.no_grad():
        emb = vit(pixels)  # the metric model's own embedding: mean-pooled final tokens -> head
    assert torch.allclose(out.score, torch.cosine_similarity(emb[:2], emb[2:]), atol=1e-5)
    assert torch.allclose(out.raw_a.sum((1, 2)), out.score, atol=1e-5)
    assert torch.allclose(out.raw_b.sum((1, 2)), out.score, atol=1e-5)
    assert out.map_a.shape == (2, 4, 4) and out.rollout_a.shape == (2, 4, 4)
    assert not torch.allclose(out.map_a, out.raw_a)  # rollout redistributed the contributions


def test_transposed_rollout_preserves_the_sum(vit, pixels):
    out = PairedSimilarity(vit, projection="head", transpose=True).explain(pixels[:2], pixels[2:])
    assert torch.allclose(out.map_a.sum((1, 2)), out.score, atol=1e-5)


def test_encoded_images_are_explained_without_another_forward(vit, pixels):
    ps = PairedSimilarity(vit, projection="head")
    enc = ps.encode(pixels)
    calls = []
    handle = vit.model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        out = ps.explain_encoded(enc.select([0, 1, 2]), enc.select([3, 3, 3]))
    finally:
        handle.remove()
    assert not calls and out.score.shape == (3,)
    swapped = ps.explain_encoded(enc.select([3, 3, 3]), enc.select([0, 1, 2]))
    assert torch.allclose(out.map_a, swapped.map_b) and torch.allclose(out.score, swapped.score)


def test_cnn_maps_decompose_the_pooled_projection(pixels):
    cnn = build_tiny_resnet("r", image_size=32, widths=(8, 8, 16, 16), num_classes=6)
    out = PairedSimilarity(cnn, projection="head").explain(pixels[:2], pixels[2:])
    with torch.no_grad():
        emb = cnn(pixels)
    assert torch.allclose(out.score, torch.cosine_similarity(emb[:2], emb[2:]), atol=1e-5)
    assert out.rollout_a is None and torch.equal(out.map_a, out.raw_a)
    assert torch.allclose(out.map_b.sum((1, 2)), out.score, atol=1e-5)


def test_unsupported_options_are_explained(vit):
    with pytest.raises(ValueError, match="pooling='mean'"):
        PairedSimilarity(vit, pooling="cls")
    with pytest.raises(ValueError, match="'head'"):
        PairedSimilarity(vit, projection="proj")
