"""Localisation scores of explanation maps, on hand-computed cases."""

from __future__ import annotations

import math
import warnings

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
    with warnings.catch_warnings():  # NaN by our rule, not by a library warning (its behaviour varies by version)
        warnings.simplefilter("error")
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


def test_segmentation_map_ranks_both_channels_against_the_one_hot_mask_by_hand():
    """Chefer et al.'s mAP scores ``(1 - map, map)`` against ``(background, object)``: one 1 x 3 image, map scaled to
    [0, 1/2, 1], object the last pixel. Entries (score, positive): background (1, T), (1/2, T), (0, F); object
    (0, F), (1/2, F), (1, T). At 1: 2 of 2 right, recall 2/3; at 1/2: 3 of 4, recall 1 -> AP = 2/3 + 1/3 * 3/4.
    An image without object counts too: background (1, T), (1/2, T), (0, T), object all F: precision 1/2 at every
    threshold -> AP 1/2. A flat map is 0 in both channels: every entry tied -> AP 1/2."""
    maps = torch.tensor([[[0.0, 1.0, 2.0]], [[0.0, 1.0, 2.0]], [[3.0, 3.0, 3.0]]])
    masks = torch.tensor([[[False, False, True]], [[False, False, False]], [[True, False, False]]])
    assert segmentation_scores(maps[:1], masks[:1])["map"] == pytest.approx(11 / 12)
    assert segmentation_scores(maps[1:2], masks[1:2])["map"] == pytest.approx(1 / 2)
    assert segmentation_scores(maps[2:], masks[2:])["map"] == pytest.approx(1 / 2)
    assert segmentation_scores(maps, masks)["map"] == pytest.approx((11 / 12 + 1 / 2 + 1 / 2) / 3)


def _chefer_segmentation(maps: torch.Tensor, masks: torch.Tensor) -> dict[str, float]:
    """Reference: Chefer et al. 2021, hila-chefer/Transformer-Explainability, baselines/ViT/imagenet_seg_eval.py
    (``eval_batch``, one image per batch) with utils/metrices.py (``batch_pix_accuracy``,
    ``batch_intersection_union``, ``get_ap_scores``), rewritten here per image in float32 as there."""
    import numpy as np
    from sklearn.metrics import average_precision_score

    total_correct = total_label = 0
    total_inter, total_union, total_ap = np.zeros(2), np.zeros(2), []
    for res, labels in zip(maps.float(), masks.long()):
        res = (res - res.min()) / (res.max() - res.min())  # 0/0 for a flat map: NaN, set to 0 below
        res_1 = res.gt(res.mean()).float()
        res_0 = res.le(res.mean()).float()
        res_1_ap, res_0_ap = res.clone(), 1 - res
        for t in (res_1, res_0, res_1_ap, res_0_ap):
            t[t != t] = 0
        output = torch.stack([res_0, res_1])  # [2, H, W]
        output_ap = torch.stack([res_0_ap, res_1_ap])
        predict = output.max(0).indices + 1  # batch_pix_accuracy / batch_intersection_union
        target = labels + 1
        total_correct += int((predict == target).sum())
        total_label += int((target > 0).sum())
        inter = predict * (predict == target)
        area_inter = np.histogram(inter.numpy(), bins=2, range=(1, 2))[0]
        area_pred = np.histogram(predict.numpy(), bins=2, range=(1, 2))[0]
        area_lab = np.histogram(target.numpy(), bins=2, range=(1, 2))[0]
        total_inter += area_inter
        total_union += area_pred + area_lab - area_inter
        one_hot = torch.zeros_like(output_ap).scatter_(0, labels[None], 1)  # get_ap_scores
        total_ap.append(np.nan_to_num(average_precision_score(one_hot.numpy().reshape(-1),
                                                              output_ap.numpy().reshape(-1))))
    return {"pixel_accuracy": total_correct / total_label, "miou": float((total_inter / total_union).mean()),
            "map": float(np.mean(total_ap))}


def test_segmentation_scores_equal_chefer_et_als_evaluation():
    gen = torch.Generator().manual_seed(0)
    masks = torch.zeros(6, 24, 24, dtype=torch.bool)
    masks[:, 6:16, 4:18] = True
    masks[4] = False  # an image without object counts in the mean
    maps = torch.rand(6, 24, 24, generator=gen) + 0.6 * masks.float()
    maps[1] = (maps[1] * 5).floor() / 8  # ties within and across the channels, exact in float32 and float64
    maps[1, 0, :2] = torch.tensor([0.0, 1.0])  # so that it is its own min-max scaling
    maps[5] = 0.25  # a flat map
    ours, reference = segmentation_scores(maps, masks), _chefer_segmentation(maps, masks)
    assert ours == pytest.approx(reference, abs=1e-6)
