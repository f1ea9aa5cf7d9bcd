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
    with pytest.raises(ValueError, match="'mean' or 'cls'"):
        PairedSimilarity(vit, pooling="max")
    with pytest.raises(ValueError, match="'head'"):
        PairedSimilarity(vit, projection="proj")
    cnn = build_tiny_resnet("r", image_size=32, widths=(8, 8, 16, 16), num_classes=6)
    with pytest.raises(ValueError, match="no CLS token"):
        PairedSimilarity(cnn, pooling="cls")


def test_default_is_mean_pooling_without_projection(vit, pixels):
    out = PairedSimilarity(vit).explain(pixels[:2], pixels[2:])
    with torch.no_grad():
        tokens = vit.final_norm(vit.run_blocks(vit.embed(pixels), 0, 2))[:, 1:].mean(1)
    assert torch.allclose(out.score, torch.cosine_similarity(tokens[:2], tokens[2:]), atol=1e-5)
    assert torch.equal(out.residual_a, torch.zeros(2))


def test_swapping_the_pair_swaps_the_maps_in_a_batch(vit, pixels):
    ps = PairedSimilarity(vit, projection="head")
    ab, ba = ps.explain(pixels[:2], pixels[2:]), ps.explain(pixels[2:], pixels[:2])
    for x, y in (("map_a", "map_b"), ("raw_a", "raw_b"), ("rollout_a", "rollout_b")):
        assert torch.allclose(getattr(ab, x), getattr(ba, y), atol=1e-6)
    assert torch.allclose(ab.score, ba.score)


def test_uint8_images_are_normalised_and_encodings_concatenate(vit):
    img = torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    ps = PairedSimilarity(vit, projection="head", batch_size=2)
    from vitscope.train.data import normalise

    enc = ps.encode(img)
    ref = ps.encode(normalise(img, vit.spec.mean, vit.spec.std))
    assert torch.allclose(enc.embeddings, ref.embeddings, atol=1e-6) and len(enc) == 3
    with torch.no_grad():
        assert torch.allclose(enc.embeddings, vit(normalise(img, vit.spec.mean, vit.spec.std)), atol=1e-5)
    assert torch.allclose(ps.embed(img), enc.embeddings)


@pytest.fixture(scope="module")
def cls_vit():
    return build_tiny_vit("c", image_size=32, depth=3, embed_dim=32, num_heads=2, num_classes=8, global_pool="token")


def test_cls_pooling_decomposes_the_last_blocks_value_paths_exactly(cls_vit, pixels):
    from vitscope.explain.cls_pooling import cls_parts

    head = cls_vit.model.head
    parts = cls_parts(cls_vit, pixels, head)
    with torch.no_grad():
        emb = cls_vit(pixels)  # head(final-norm CLS)
    assert torch.allclose(parts.parts.sum(1) + parts.rest, emb, atol=1e-5)
    # the spatial value paths add up to the last attention's CLS output minus the prefix path and the bias
    with cls_vit.record(["blocks.2.attn_out", "blocks.2.attn.pattern", "blocks.2.attn.v"]) as rec, torch.no_grad():
        cls_vit(pixels)
        attn_out, a, v = rec["blocks.2.attn_out"][:, 0], rec["blocks.2.attn.pattern"], rec["blocks.2.attn.v"]
    proj = cls_vit.model.blocks[2].attn.proj
    u = (a[:, :, 0, :, None] * v).permute(0, 2, 1, 3).reshape(4, 17, 32)  # [B, N, D] per-token values
    with torch.no_grad():
        assert torch.allclose(proj(u.sum(1)), attn_out, atol=1e-5)
        spatial = u[:, 1:] @ proj.weight.T  # what cls_parts calls c_x, before the norm and the head
    assert spatial.shape == (4, 16, 32) and parts.parts.shape == (4, 16, 8)


def test_cls_pooling_maps_sum_to_the_score(cls_vit, pixels):
    ps = PairedSimilarity(cls_vit, pooling="cls", projection="head", transpose=True)
    out = ps.explain(pixels[:2], pixels[2:])
    with torch.no_grad():
        emb = cls_vit(pixels)
    assert torch.allclose(out.score, torch.cosine_similarity(emb[:2], emb[2:]), atol=1e-5)
    assert torch.allclose(out.raw_a.sum((1, 2)) + out.residual_a, out.score, atol=1e-5)
    assert torch.allclose(out.map_a.sum((1, 2)), out.score, atol=1e-5)  # residual spread, then R^T
    assert torch.allclose(out.map_b.sum((1, 2)), out.score, atol=1e-5)
    assert torch.allclose(out.rollout_a.sum((1, 2)), torch.ones(2), atol=1e-5)
    swapped = ps.explain(pixels[2:], pixels[:2])
    assert torch.allclose(out.map_a, swapped.map_b, atol=1e-6)


def test_auto_pooling_is_the_pooling_attribute_and_explanations_explain():
    from helpers.hf_factories import make
    from vitscope.explain.pair_report import default_pooling, explained_embedding
    from vitscope.models.hf_load import wrap_hf
    from vitscope.models.outputs import embedding_of

    headless_cls = wrap_hf(make("vit"), "vit")  # no head, a CLS token: its embedding is the CLS token
    assert default_pooling(headless_cls) == explained_embedding("vit", headless_cls)[0] == "cls"
    headless_avg = build_tiny_vit("a", image_size=32, depth=1, embed_dim=16, num_heads=2, num_classes=0,
                                  global_pool="avg")  # no head, pools its spatial mean although it has a CLS token
    assert default_pooling(headless_avg) == explained_embedding("a", headless_avg)[0] == "mean"
    classifier = wrap_hf(make("vit-cls"), "vit-cls")
    assert explained_embedding("vit-cls", classifier) is None and default_pooling(classifier) == "mean"

    x = torch.randn(4, 3, *headless_cls.spec.image_size, generator=torch.Generator().manual_seed(1))
    out = PairedSimilarity(headless_cls, pooling=default_pooling(headless_cls)).explain(x[:2], x[2:])
    with torch.no_grad(), headless_cls.record("final_norm") as rec:
        headless_cls(x)
        emb = embedding_of(headless_cls, rec["final_norm"], "cls")
    assert torch.allclose(out.score, torch.cosine_similarity(emb[:2], emb[2:]), atol=1e-5)


@pytest.mark.parametrize("kind", ["resnet", "bit", "convnext"])
def test_cnn_score_is_the_models_own_embedding_cosine(kind):
    from helpers.hf_factories import make
    from vitscope.models.hf_load import wrap_hf
    from vitscope.models.outputs import embedding_of

    model = make(kind)
    cnn = wrap_hf(model, kind)
    x = torch.randn(4, 3, *cnn.spec.image_size, generator=torch.Generator().manual_seed(2))
    out = PairedSimilarity(cnn).explain(x[:2], x[2:])
    with torch.no_grad():  # the model's own pooled embedding (ConvNeXt: LayerNorm of the mean of its map)
        own = getattr(model, model.base_model_prefix, model)(pixel_values=x).pooler_output.flatten(1)
        with cnn.record("features") as rec:
            cnn(x)
            read = embedding_of(cnn, rec["features"], "mean")  # what attribute and explanations score
    assert torch.allclose(out.score, torch.cosine_similarity(own[:2], own[2:]), atol=1e-5)
    assert torch.allclose(read, own, atol=1e-5)
    assert torch.allclose(out.raw_a.sum((1, 2)) + out.residual_a, out.score, atol=1e-5)
    assert torch.allclose(out.map_b.sum((1, 2)), out.score, atol=1e-5)
