"""Retrieval with explanations, class maps, SOP-format data and model comparisons."""

import pytest
import torch

from vitscope.explain import (
    PairedSimilarity,
    class_similarity_maps,
    explain_pairs_across_models,
    explain_retrieval,
    retrieve_across_models,
    sop_tensors,
)
from vitscope.functional.similarity import retrieval_metrics
from vitscope.models.wrap import build_tiny_resnet, build_tiny_vit


@pytest.fixture(scope="module")
def vit():
    return build_tiny_vit("v", image_size=32, depth=2, embed_dim=32, num_heads=2, num_classes=8, global_pool="avg")


@pytest.fixture(scope="module")
def images():
    return torch.randint(0, 256, (12, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))


LABELS = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 4])


def test_top_k_maps_come_from_the_cache_without_a_forward_pass(vit, images):
    ps = PairedSimilarity(vit, projection="head")
    gallery = ps.encode(images)
    calls = []
    handle = vit.model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        res = explain_retrieval(ps, gallery, LABELS, k=3, queries=[0, 4, 11], chunk=4)
    finally:
        handle.remove()
    assert not calls
    emb = gallery.embeddings
    sims = torch.nn.functional.normalize(emb, dim=-1) @ torch.nn.functional.normalize(emb, dim=-1).T
    sims.fill_diagonal_(-2)
    assert torch.equal(res.indices, sims[[0, 4, 11]].topk(3, dim=-1).indices)
    assert torch.equal(res.correct, LABELS[res.indices] == LABELS[[0, 4, 11]][:, None])
    direct = ps.explain(images[[4]], images[[int(res.indices[1, 2])]])
    assert torch.allclose(res.query_maps[1, 2], direct.map_a[0], atol=1e-5)
    assert torch.allclose(res.gallery_maps[1, 2], direct.map_b[0], atol=1e-5)
    assert torch.allclose(res.scores[1, 2], direct.score[0], atol=1e-5)
    assert res.query_rollout.shape == (3, 4, 4)
    assert res.metrics == pytest.approx(retrieval_metrics(emb, LABELS, ks=(1, 2, 4, 8)))


def test_class_maps_sum_the_maps_of_same_class_gallery_images(vit, images):
    ps = PairedSimilarity(vit, projection="head", transpose=True)
    gallery = ps.encode(images)
    maps, counts = class_similarity_maps(ps, gallery, LABELS, [0, 9, 11])
    assert counts.tolist() == [2, 1, 0] and torch.equal(maps[2], torch.zeros(4, 4))
    pair = ps.explain(images[[0, 0]], images[[1, 2]])
    assert torch.allclose(maps[0], pair.map_a.sum(0), atol=1e-5)
    # with R^T each map sums to its score, so the class map sums to the summed scores
    assert maps[0].sum() == pytest.approx(float(pair.score.sum()), abs=1e-5)


def test_retrieval_metrics_on_sop_format_synthetic_data(tmp_path, vit):
    from pytorch_metric_learning.distances import CosineSimilarity
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
    from pytorch_metric_learning.utils.inference import CustomKNN

    from vitscope.data.synthetic.world import SyntheticWorld
    from vitscope.data.synthetic.write import synthesize

    root = synthesize(tmp_path / "sop", "sop", n=48, size=32, seed=5)
    data = sop_tensors(root, vit.spec, split="test")
    # labels are the products: the main object of the scene each image was rendered from
    world = SyntheticWorld(size=32, seed=5, num_instances_per_class=4)
    mains = sorted({max(s.objects, key=lambda o: o.mask.sum()).instance_id for s in world.scenes(48)})
    assert set(data.labels.tolist()) == set(mains[round(len(mains) / 2):])  # SOP: test holds the upper half
    assert len(data) >= 10 and len(torch.unique(data.labels)) >= 3
    perfect = torch.nn.functional.one_hot(data.labels).float()
    assert retrieval_metrics(perfect, data.labels)["map@r"] == pytest.approx(1.0)
    ps = PairedSimilarity(vit, projection="head")
    res = explain_retrieval(ps, ps.encode(data.images), data.labels, k=2)
    ref = AccuracyCalculator(include=("precision_at_1", "mean_average_precision_at_r"),
                             knn_func=CustomKNN(CosineSimilarity())).get_accuracy(
        ps.encode(data.images).embeddings, data.labels)
    assert res.metrics["recall@1"] == pytest.approx(ref["precision_at_1"], abs=1e-6)
    assert res.metrics["map@r"] == pytest.approx(ref["mean_average_precision_at_r"], abs=1e-6)
    assert res.query_maps.shape == (len(data), 2, 4, 4)


def test_models_side_by_side(vit, images):
    cnn = build_tiny_resnet("r", image_size=32, widths=(8, 8, 16, 16), num_classes=6)
    pairs = explain_pairs_across_models([vit, cnn], images[:2], images[2:4])
    assert set(pairs) == {"v", "r"} and pairs["v"].map_a.shape == (2, 4, 4) and pairs["r"].map_a.shape == (2, 2, 2)
    assert pairs["r"].rollout_a is None and pairs["v"].rollout_a is not None
    ranked = retrieve_across_models([vit, cnn], images, LABELS, queries=[0, 3], k=2)
    for name, ps_model in (("v", vit), ("r", cnn)):
        ps = PairedSimilarity(ps_model, projection="head")
        assert torch.equal(ranked[name].indices, explain_retrieval(ps, ps.encode(images), LABELS, 2, [0, 3]).indices)


def test_no_queries_give_empty_results_and_no_images_a_clear_error(vit, images):
    from vitscope.errors import VitscopeValueError

    ps = PairedSimilarity(vit, projection="head")
    gallery = ps.encode(images[:4])
    maps, counts = class_similarity_maps(ps, gallery, LABELS[:4], [])
    assert maps.shape == (0, 4, 4) and counts.shape == (0,)
    res = explain_retrieval(ps, gallery, LABELS[:4], k=2, queries=[])
    assert res.query_maps.shape == res.gallery_maps.shape == (0, 2, 4, 4) and res.indices.shape == (0, 2)
    assert res.query_rollout.shape == (0, 4, 4) and res.metrics  # the gallery's metrics need no query
    with pytest.raises(VitscopeValueError, match="at least one image"):
        ps.encode(images[:0])
    with pytest.raises(VitscopeValueError, match="at least one image"):
        ps.encode([])
