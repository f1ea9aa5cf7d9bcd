"""Paired similarity sums to the cosine score; retrieval metrics equal pytorch-metric-learning's."""

import pytest
import torch
from torch import nn

from vitscope.functional.similarity import paired_similarity, retrieval_metrics


def _tokens(b, k, d, seed):
    return torch.randn(b, k, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("projection", ["none", "matrix", "linear"])
def test_contributions_sum_to_the_cosine_score(projection):
    a, b = _tokens(3, 12, 8, 0), _tokens(3, 20, 8, 1)
    proj = None
    if projection == "matrix":
        proj = torch.randn(5, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    elif projection == "linear":
        torch.manual_seed(3)
        proj = nn.Linear(8, 5).double()
    ga, gb, score = paired_similarity(a, b, proj)
    assert ga.shape == (3, 12) and gb.shape == (3, 20) and score.shape == (3,)
    assert torch.allclose(ga.sum(-1), score, atol=1e-10) and torch.allclose(gb.sum(-1), score, atol=1e-10)
    ea = a.mean(1) if proj is None else (a.mean(1) @ (proj if isinstance(proj, torch.Tensor) else proj.weight).T
                                         + (0 if not isinstance(proj, nn.Linear) else proj.bias))
    eb = b.mean(1) if proj is None else (b.mean(1) @ (proj if isinstance(proj, torch.Tensor) else proj.weight).T
                                         + (0 if not isinstance(proj, nn.Linear) else proj.bias))
    assert torch.allclose(score, torch.cosine_similarity(ea, eb, dim=-1), atol=1e-10)


def test_swapping_the_pair_swaps_the_maps():
    a, b = _tokens(2, 9, 4, 4), _tokens(2, 16, 4, 5)
    ga, gb, s = paired_similarity(a, b)
    gb2, ga2, s2 = paired_similarity(b, a)
    assert torch.allclose(ga, ga2) and torch.allclose(gb, gb2) and torch.allclose(s, s2)


def test_hand_computed_pair():
    a = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])  # beta_a = (0.5, 0.5)
    b = torch.tensor([[[1.0, 0.0]]])  # beta_b = (1, 0)
    ga, gb, s = paired_similarity(a, b)
    # score = 0.5 / (sqrt(0.5) * 1); token 1 contributes 1 / (2 * sqrt(0.5)), token 2 nothing
    assert s.item() == pytest.approx(0.5 / 0.5 ** 0.5)
    assert ga[0].tolist() == pytest.approx([1 / (2 * 0.5 ** 0.5), 0.0])
    assert gb[0].tolist() == pytest.approx([s.item()])


def test_bad_shapes_are_explained():
    with pytest.raises(ValueError, match="share B and D"):
        paired_similarity(torch.zeros(1, 2, 3), torch.zeros(1, 2, 4))
    with pytest.raises(ValueError, match=r"\[E, 3\]"):
        paired_similarity(torch.ones(1, 2, 3), torch.ones(1, 2, 3), torch.ones(2, 4))


def test_retrieval_metrics_match_pytorch_metric_learning():
    from pytorch_metric_learning.distances import CosineSimilarity
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
    from pytorch_metric_learning.utils.inference import CustomKNN

    gen = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 12, (150,), generator=gen)
    centres = torch.randn(12, 16, generator=gen)
    emb = centres[labels] + 0.9 * torch.randn(150, 16, generator=gen)
    ours = retrieval_metrics(emb, labels)
    calc = AccuracyCalculator(include=("precision_at_1", "mean_average_precision_at_r"),
                              knn_func=CustomKNN(CosineSimilarity()))
    ref = calc.get_accuracy(emb, labels)  # query set == reference set: leave-one-out
    assert ours["recall@1"] == pytest.approx(ref["precision_at_1"], abs=1e-6)
    assert ours["map@r"] == pytest.approx(ref["mean_average_precision_at_r"], abs=1e-6)
    assert set(ours) == {"recall@1", "recall@2", "recall@4", "recall@8", "map@r"}


def test_decomposed_similarity_generalises_mean_pooling_and_keeps_the_rest():
    from vitscope.functional.similarity import decomposed_similarity

    a, b = _tokens(3, 12, 8, 6), _tokens(3, 20, 8, 7)
    ga, gb, s = paired_similarity(a, b)
    ga2, gb2, s2, ra, rb = decomposed_similarity(a / 12, b / 20)
    assert torch.allclose(ga, ga2) and torch.allclose(gb, gb2) and torch.allclose(s, s2)
    assert torch.equal(ra, torch.zeros(3, dtype=ra.dtype)) and torch.equal(rb, torch.zeros(3, dtype=rb.dtype))
    rest_a, rest_b = _tokens(3, 1, 8, 8)[:, 0], _tokens(3, 1, 8, 9)[:, 0]
    ga, gb, s, ra, rb = decomposed_similarity(a, b, rest_a, rest_b)
    ea, eb = a.sum(1) + rest_a, b.sum(1) + rest_b
    assert torch.allclose(s, torch.cosine_similarity(ea, eb, dim=-1), atol=1e-10)
    assert torch.allclose(ga.sum(-1) + ra, s, atol=1e-10) and torch.allclose(gb.sum(-1) + rb, s, atol=1e-10)
    assert not torch.allclose(ga.sum(-1), s)  # the rest carries a real share here


def test_redistribution_with_the_transposed_rollout_preserves_the_sum():
    from vitscope.functional.similarity import redistribute

    gen = torch.Generator().manual_seed(3)
    r = torch.rand(2, 6, 6, generator=gen, dtype=torch.float64)
    r = r / r.sum(-1, keepdim=True)  # row-stochastic, as the rollout
    gamma = torch.randn(2, 6, generator=gen, dtype=torch.float64)
    assert torch.allclose(redistribute(gamma, r, transpose=True).sum(-1), gamma.sum(-1))
    assert torch.allclose(redistribute(gamma, r), (r @ gamma.unsqueeze(-1)).squeeze(-1))
    assert not torch.allclose(redistribute(gamma, r).sum(-1), gamma.sum(-1))
    with pytest.raises(ValueError, match=r"\[B, K, K\]"):
        redistribute(gamma, r[:, :5, :5])


def test_cosine_topk_matches_brute_force_and_excludes_the_query():
    from vitscope.functional.similarity import cosine_topk

    gen = torch.Generator().manual_seed(4)
    gal = torch.randn(30, 5, generator=gen)
    q = torch.tensor([0, 7, 29])
    scores, idx = cosine_topk(gal[q], gal, 4, exclude=q)
    assert idx.shape == (3, 4) and not (idx == q[:, None]).any()
    sims = torch.nn.functional.normalize(gal, dim=-1) @ torch.nn.functional.normalize(gal, dim=-1).T
    sims[q, q] = -2
    assert torch.equal(idx, sims[q].topk(4, dim=-1).indices)
    assert torch.allclose(scores, sims[q].topk(4, dim=-1).values, atol=1e-6)
    with pytest.raises(ValueError, match="k must be"):
        cosine_topk(gal[q], gal, 30, exclude=q)


def test_display_map_is_bicubic_then_min_max():
    from vitscope.functional.similarity import display_map

    m = torch.tensor([[[0.0, 1.0], [2.0, 3.0]], [[5.0, 5.0], [5.0, 5.0]]])
    out = display_map(m, (8, 8))
    assert out.shape == (2, 8, 8)
    assert out[0].min() == 0 and out[0].max() == 1 and torch.equal(out[1], torch.zeros(8, 8))
    ref = torch.nn.functional.interpolate(m[:1, None], size=(8, 8), mode="bicubic", align_corners=False)[0, 0]
    assert torch.allclose(out[0], (ref - ref.min()) / (ref.max() - ref.min()))
    assert out[0, -1, -1] > out[0, 0, 0]  # the orientation survives


def test_display_map_shows_a_map_flat_to_float_rounding_and_one_with_nan_as_flat():
    from vitscope.functional.similarity import display_map, upsample_maps

    flat = torch.full((1, 5, 7), 0.3)
    up = upsample_maps(flat, (33, 47))
    assert up.max() > up.min()  # bicubic weights leave it uneven by rounding: min-max would blow that up
    assert torch.equal(display_map(flat, (33, 47)), torch.zeros(1, 33, 47))
    holed = torch.rand(1, 4, 4)
    holed[0, 1, 1] = float("nan")
    assert torch.equal(display_map(holed, (8, 8)), torch.zeros(1, 8, 8))


def test_frozen_layer_norm_shares_add_up_to_the_norm_less_its_bias():
    from vitscope.functional.similarity import frozen_layer_norm

    parts = _tokens(3, 5, 8, 10)
    total = parts.sum(1)
    norm = torch.nn.LayerNorm(8, eps=1e-6).double()
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 2.0, 8))
        norm.bias.copy_(torch.linspace(-1.0, 1.0, 8))
        shares = frozen_layer_norm(parts, total, norm.weight, norm.eps)
        assert torch.allclose(shares.sum(1), norm(total) - norm.bias, atol=1e-12)
    sigma = torch.sqrt(total.var(-1, unbiased=False) + 1e-6)  # one share by hand
    x = parts[1, 2]
    assert torch.allclose(shares[1, 2], norm.weight.detach() * (x - x.mean()) / sigma[1], atol=1e-12)
