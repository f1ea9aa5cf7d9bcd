"""Localisation scores of explanation maps, on hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from vitscope.errors import VitscopeValueError
from vitscope.functional.explanation_scores import mask_auroc, pointing_game, relevance_mass, segmentation_scores


def test_pointing_relevance_mass_and_auroc_by_hand():
    maps = torch.tensor([[[0.0, 1.0], [3.0, -2.0]],    # maximum 3 at (1, 0): inside
                         [[5.0, 1.0], [1.0, 1.0]],     # maximum 5 at (0, 0): outside
                         [[-1.0, -1.0], [-1.0, -1.0]]])  # no positive relevance
    masks = torch.tensor([[[False, False], [True, True]],
                          [[False, True], [True, False]],
                          [[False, True], [False, False]]])  # a constant map points at its first cell
    assert pointing_game(maps, masks).tolist() == [True, False, False]
    mass = relevance_mass(maps, masks)
    assert mass[0] == pytest.approx(3 / 4) and mass[1] == pytest.approx(2 / 8) and math.isnan(float(mass[2]))
    auroc = mask_auroc(maps, masks)
    # image 0: inside {3, -2}, outside {0, 1}: pairs (3>0, 3>1, -2<0, -2<1) -> 2 of 4
    assert float(auroc[0]) == pytest.approx(0.5)
    # image 1: inside {1, 1}, outside {5, 1}: pairs (1<5, 1=1 -> 1/2, 1<5, 1=1 -> 1/2) -> 1 of 4
    assert float(auroc[1]) == pytest.approx(0.25)
    assert float(auroc[2]) == pytest.approx(0.5)  # a constant map ranks nothing: chance
    full = mask_auroc(maps[:1], torch.ones_like(masks[:1]))
    assert math.isnan(float(full[0]))


def test_shapes_must_agree():
    with pytest.raises(VitscopeValueError, match="same shape"):
        pointing_game(torch.zeros(1, 2, 2), torch.zeros(1, 3, 3, dtype=torch.bool))


def test_segmentation_scores_by_hand():
    """One 2 x 2 image: the map scaled to [0, 1/3, 2/3, 1], mean 1/2: predicted object = the two higher pixels."""
    maps = torch.tensor([[[0.0, 1.0], [2.0, 3.0]]])
    masks = torch.tensor([[[False, True], [False, True]]])  # object: pixels 1 and 3
    scores = segmentation_scores(maps, masks)
    # predicted {2, 3}, truth {1, 3}: correct pixels 0 and 3 -> 2 of 4
    assert scores["pixel_accuracy"] == pytest.approx(0.5)
    # object: intersection {3} / union {1, 2, 3} = 1/3; background: {0} / {0, 1, 2} = 1/3
    assert scores["miou"] == pytest.approx(1 / 3)
    # ranking 3 (object), 2 (not), 1 (object), 0: precision at the two objects 1/1 and 2/3 -> AP = (1 + 2/3) / 2
    assert scores["map"] == pytest.approx((1 + 2 / 3) / 2)
