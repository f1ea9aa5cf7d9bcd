"""What ``vitscope explanations`` explains: a classifier's logit of the label, a metric-learning net's cosine of its
projected embedding to the next image's (its head is a projection, not classes)."""

from __future__ import annotations

import pytest
import torch

import vitscope
from vitscope.attribution import attribute
from vitscope.explain.benchmark import BenchmarkData, benchmark_model


@pytest.mark.parametrize("name", ["tiny-vit-metric", "tiny-resnet-metric"])
def test_a_metric_net_is_scored_by_the_cosine_of_its_projected_embedding_to_the_next_images(name: str) -> None:
    b = vitscope.load_model(name)
    assert b.spec.has_head  # a linear head, as a classifier's: only the zoo's recipe tells them apart
    h, w = b.spec.image_size
    pixels = torch.randn(3, 3, h, w, generator=torch.Generator().manual_seed(0))
    objects = torch.zeros(3, h, w, dtype=torch.bool)
    objects[:, : h // 2] = True
    data = BenchmarkData(pixels, objects, torch.tensor([0, 8, 6]), None)
    method = "chefer" if b.spec.is_transformer else "gradcam"
    _, maps, curves = benchmark_model(b, name, data, [method], steps=2, sanity=False)
    with torch.no_grad():
        emb = b.model(pixels)  # the net's own output: its projected embedding
    assert emb.shape == (3, 128)
    partner = emb.roll(-1, 0)
    cosine = torch.nn.functional.cosine_similarity(emb, partner, dim=-1)
    # nothing deleted yet: the score is the cosine to the next image's embedding, not the embedding's coordinate
    assert float(curves[method]["deletion_mean"][0]) == pytest.approx(float(cosine.mean()), abs=1e-5)
    head = b.model.head if b.spec.is_transformer else b.model.fc
    own = attribute(b, pixels, partner, method, pooling="mean", projection=head)
    torch.testing.assert_close(maps[method], own.cpu(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ["tiny-vit-sup", "tiny-vit-metric"])
def test_the_scores_are_those_of_the_images_whatever_the_chunk_of_images_at_a_time(name: str, monkeypatch) -> None:
    """Attributions and forwards run a few images at a time (memory of one chunk); every map, curve and score is
    that of all the images at once (ROAD's imputation, which reads no chunk, left out for time)."""
    monkeypatch.setattr("vitscope.explain.benchmark.FAITHFULNESS_FILLS", ("mean",))
    b = vitscope.load_model(name)
    h, w = b.spec.image_size
    pixels = torch.randn(5, 3, h, w, generator=torch.Generator().manual_seed(1))
    objects = torch.zeros(5, h, w, dtype=torch.bool)
    objects[:, h // 4: h // 2, w // 4:] = True
    data = BenchmarkData(pixels, objects, torch.tensor([0, 3, 6, 9, 1]), None)
    methods = ["chefer", "rollout"]
    whole = benchmark_model(b, name, data, methods, steps=2, sanity=False, batch_size=5)
    parts = benchmark_model(b, name, data, methods, steps=2, sanity=False, batch_size=2)
    for method in methods:
        torch.testing.assert_close(parts[1][method], whole[1][method], rtol=1e-5, atol=1e-7)
    assert [(r.method, r.metric) for r in parts[0]] == [(r.method, r.metric) for r in whole[0]]
    for got, want in zip(parts[0], whole[0]):
        assert got.value == pytest.approx(want.value, rel=1e-5, abs=1e-7, nan_ok=True), (got.method, got.metric)
