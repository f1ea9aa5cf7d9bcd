"""Semantic and pose similarity (paper 000 section 5.2): class histograms and their dot products."""

import pytest
import torch

from vitscope.explain import pose_similarity_at_k, scene_segmentations
from vitscope.functional.semantic import class_histograms, pose_similarity


def test_histograms_by_hand():
    seg = torch.tensor([[[0, 0], [1, -1]], [[2, 2], [2, 2]]])
    h = class_histograms(seg, 3)
    assert h.tolist() == [pytest.approx([2 / 3, 1 / 3, 0.0]), [0.0, 0.0, 1.0]]  # -1 is not counted
    h2 = class_histograms(seg, 3, normalize="l2")
    assert h2.norm(dim=1).tolist() == pytest.approx([1.0, 1.0])
    with pytest.raises(ValueError, match="l1"):
        class_histograms(seg, 3, normalize="max")


def test_pose_similarity_is_a_dot_product_per_retrieved_image():
    q = torch.tensor([[0.5, 0.5, 0.0]])
    r = torch.tensor([[[0.5, 0.5, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]])
    assert pose_similarity(q, r).tolist() == [pytest.approx([0.5, 0.0, 0.5])]
    with pytest.raises(ValueError, match=r"\[Q, k, C\]"):
        pose_similarity(q, r[0])


def test_pose_similarity_at_k_with_masks_or_a_callable():
    from vitscope.data.synthetic.world import SyntheticWorld

    world = SyntheticWorld(size=32, seed=3)
    scenes = list(world.scenes(6))
    seg = scene_segmentations(scenes, world.num_classes)
    assert seg.shape == (6, 32, 32) and int(seg.max()) < world.num_classes + world.num_backgrounds
    obj = scenes[0].objects[-1]  # drawn last: fully visible
    assert (seg[0][torch.from_numpy(obj.mask)] == obj.class_id).all()
    images = torch.from_numpy(__import__("numpy").stack([s.image for s in scenes])).permute(0, 3, 1, 2)
    indices, queries = torch.tensor([[1, 2], [0, 5]]), torch.tensor([0, 3])
    classes = world.num_classes + world.num_backgrounds
    from_masks = pose_similarity_at_k(indices, queries, seg, classes)
    calls = []

    def segment(x):
        calls.append(len(x))
        return seg[[int(i) for i in torch.unique(torch.cat([queries, indices.flatten()]))]]

    from_callable = pose_similarity_at_k(indices, queries, segment, classes, images=images)
    assert calls == [5]  # only the images used are segmented
    assert torch.allclose(from_masks["per_query"], from_callable["per_query"])
    hist = class_histograms(seg, classes)
    assert from_masks["per_query"][1, 1] == pytest.approx(float(hist[3] @ hist[5]))
    assert from_masks["mean"] == pytest.approx(float(from_masks["per_query"].mean()))
    with pytest.raises(ValueError, match="needs the gallery images"):
        pose_similarity_at_k(indices, queries, segment, classes)
