"""A metric-learning head on your own ImageFolder: trains the projection only, works for ViTs and CNNs."""

import pytest
import torch

from vitscope.data.synthetic.write import synthesize
from vitscope.models.wrap import build_tiny_resnet, build_tiny_vit
from vitscope.train.data import image_folder_tensors
from vitscope.train.embedding import EmbeddingNet, train_embedding
from vitscope.train.metric import MetricConfig


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return synthesize(tmp_path_factory.mktemp("folder"), "imagefolder", n=48, size=32, seed=2)


@pytest.mark.parametrize("arch", ["vit", "resnet"])
def test_frozen_backbone_head_trains_and_backbone_is_untouched(folder, arch):
    backbone = (build_tiny_vit("v", image_size=32, depth=2, embed_dim=32, num_heads=2, num_classes=0)
                if arch == "vit" else build_tiny_resnet("r", image_size=32, widths=(8, 16, 16, 32), num_classes=0))
    before = {k: v.clone() for k, v in backbone.model.state_dict().items()}
    net = train_embedding(backbone, folder, steps=8, batch_size=16, embedding_size=8, config=MetricConfig(lr=0.05))
    after = backbone.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # frozen, BN statistics included
    emb = net(torch.zeros(2, 3, 32, 32))
    assert emb.shape == (2, 8) and not net.training


def test_image_folder_tensors_follow_the_model_preprocessing(folder):
    backbone = build_tiny_vit("v", image_size=32, depth=1, embed_dim=16, num_heads=2)
    data = image_folder_tensors(folder, backbone.spec)
    assert data.images.shape[1:] == (3, 32, 32) and data.images.dtype == torch.uint8
    assert len(data) == 48 and data.num_classes == len(data.class_names)


def test_cls_pooling_needs_a_cls_token():
    cnn = build_tiny_resnet("r", image_size=32, widths=(8, 8, 8, 8))
    with pytest.raises(ValueError, match="no CLS token"):
        EmbeddingNet(cnn, pooling="cls")
