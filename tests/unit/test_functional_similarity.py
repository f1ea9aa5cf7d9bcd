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
