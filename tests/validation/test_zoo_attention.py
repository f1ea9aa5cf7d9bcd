"""Issue 5's validation on the tiny zoo: trained attention finds objects, untrained attention is flat."""

import math

import pytest
import torch

import vitscope
from vitscope.analyses.attention.saliency import SaliencyIoU
from vitscope.data import load_dataset
from vitscope.data.annotated_source import AnnotatedSource
from vitscope.data.synthetic.write import synthesize
from vitscope.zoo.catalog import get_entry
from vitscope.zoo.store import build_model, wrap_zoo_model


@pytest.fixture(scope="module")
def heldout_coco(tmp_path_factory):
    # a world seed no zoo model trained on (the zoo trains on seed 0); one object per scene, as saliency sets
    root = synthesize(tmp_path_factory.mktemp("heldout"), "coco", n=96, size=64, seed=4242, max_objects=1)
    return AnnotatedSource(load_dataset(root, format="coco"))


@pytest.mark.parametrize("name", ["tiny-vit-sup", "tiny-vit-distill"])
def test_trained_heads_find_the_objects(name, heldout_coco):
    result = vitscope.run(vitscope.load_model(name), heldout_coco, [SaliencyIoU()], batch_size=32)["saliency_iou"]
    margins = {src: (result[f"{src}_best_iou"] - result[f"random_{src}_best_iou"]).max().item()
               for src in ("cls", "spatial")}
    assert max(margins.values()) >= 0.15, margins


def test_untrained_twin_cls_attention_is_close_to_uniform_and_trained_is_not(heldout_coco):
    def cls_entropy(backbone):
        images = [heldout_coco.get(i).image for i in range(32)]
        names = [f"blocks.{i}.attn.pattern" for i in range(backbone.spec.num_blocks)]
        with torch.no_grad(), backbone.record(names) as rec:
            backbone(backbone.preprocess(images))
        rows = torch.stack([rec[n][:, :, 0] for n in names])  # [L, B, H, N] CLS query rows
        ent = -(rows * rows.clamp_min(1e-12).log()).sum(-1)
        return (ent / math.log(rows.shape[-1])).mean(1)  # [L, H], 1 = uniform

    twin = cls_entropy(wrap_zoo_model(build_model(get_entry("tiny-vit-sup")), "twin"))
    trained = cls_entropy(vitscope.load_model("tiny-vit-sup"))
    assert twin.min().item() > 0.97, twin
    assert trained.min().item() < 0.9, trained
