"""Blocked exact k-NN search: equal to brute force whatever the tiles, ties by position, self excluded."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vitscope.functional.knn_search import knn_search


def _brute(q, b, k, metric, exclude_self=False):
    if metric == "cosine":
        q, b = torch.nn.functional.normalize(q, dim=1), torch.nn.functional.normalize(b, dim=1)
    s = q @ b.T if metric != "l2" else -torch.cdist(q.double(), b.double()).square().float()
    if exclude_self:
        s.fill_diagonal_(-torch.inf)
    return s.topk(k, dim=1)


@pytest.mark.parametrize("metric", ["ip", "cosine", "l2"])
def test_equals_brute_force_with_tiles_smaller_than_the_data(metric):
    g = torch.Generator().manual_seed(0)
    q, b = torch.randn(37, 8, generator=g), torch.randn(101, 8, generator=g)
    scores, index = knn_search(q, b, k=5, metric=metric, query_tile=6, bank_tile=13)
    ref = _brute(q, b, 5, metric)
    assert torch.equal(index, ref.indices)
    torch.testing.assert_close(scores, ref.values, rtol=1e-5, atol=1e-5)


def test_exclude_self_and_hand_computed_case():
    bank = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.5, 0.5]])
    scores, index = knn_search(bank, bank, k=2, exclude_self=True, query_tile=3, bank_tile=2)
    # row 0 with rows 1, 2, 3: 0.9, 0, 0.5 -> rows 1 then 3; row 3 ties at 0.5 with rows 0, 1, 2 -> 0 then 1
    assert index.tolist() == [[1, 3], [0, 3], [3, 1], [0, 1]]
    torch.testing.assert_close(scores[0], torch.tensor([0.9, 0.5]))


def test_ties_go_to_the_lower_position_across_tiles():
    bank = torch.ones(10, 3)  # every row scores the same
    _, index = knn_search(torch.ones(2, 3), bank, k=4, bank_tile=3)
    assert index.tolist() == [[0, 1, 2, 3]] * 2


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 20), st.integers(2, 30), st.integers(1, 9), st.integers(1, 9), st.data())
def test_tiles_never_change_the_neighbours(nq, nb, tq, tb, data):
    k = data.draw(st.integers(1, nb))
    g = torch.Generator().manual_seed(nq * 100 + nb)
    q, b = torch.randn(nq, 4, generator=g), torch.randn(nb, 4, generator=g)
    whole = knn_search(q, b, k=k, query_tile=1000, bank_tile=1000)
    tiled = knn_search(q, b, k=k, query_tile=tq, bank_tile=tb)
    assert torch.equal(whole[1], tiled[1])


def test_bad_arguments_are_clear():
    q = torch.zeros(3, 4)
    with pytest.raises(ValueError, match="k must be"):
        knn_search(q, q, k=3, exclude_self=True)
    with pytest.raises(ValueError, match="feature sizes"):
        knn_search(q, torch.zeros(3, 5))
    with pytest.raises(ValueError, match="metric"):
        knn_search(q, q, k=1, metric="hamming")
    with pytest.raises(ValueError, match="exclude_self"):
        knn_search(q, torch.zeros(4, 4), k=1, exclude_self=True)
