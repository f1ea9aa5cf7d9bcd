"""The attention suite runs in one pass on every registered backbone with attention, and agrees with the
functional definitions on that backbone's own recorded patterns; CNNs get a clear "no attention" error."""

from __future__ import annotations

import math

import pytest
import torch
from PIL import Image

import vitscope
import vitscope.functional as F
from helpers.hf_factories import kinds, make
from vitscope import wrap
from vitscope.analyses import AlignedAttention, attention_suite, default_analyses
from vitscope.analyses.attention.suite import NoAttentionError
from vitscope.data.source import Source
from vitscope.data.synthetic import SyntheticWorld
from vitscope.models.registry import registry

# offline tiny models (zoo entries share tiny-vit's architecture and need built weights)
TINY = [name for name, e in registry().items() if e.builder is not None and not getattr(e, "zoo", False)]
TINY_VITS = [t for t in TINY if not t.endswith("resnet")]
TRANSFORMER_KINDS, CNN_KINDS = kinds(), kinds(cnn=True)  # every registered test factory
NUM_IMAGES = 3


class MaskedScenes(Source):
    """In-memory synthetic scenes with their instance masks as ``targets["masks"]`` (a vitscope Source)."""

    def __init__(self, n: int, size: int = 48) -> None:
        super().__init__()
        world = SyntheticWorld(num_classes=4, size=size, seed=5)
        self.scenes = [world.scene(i) for i in range(n)]
        self.paths = [f"scene:{i}" for i in range(n)]

    def load(self, i: int) -> Image.Image:
        return Image.fromarray(self.scenes[i].image)

    def targets(self, i: int) -> dict:
        return {"masks": torch.stack([torch.from_numpy(o.mask) for o in self.scenes[i].objects]).numpy()}


@pytest.fixture(scope="module")
def scenes() -> MaskedScenes:
    return MaskedScenes(NUM_IMAGES)


def backbone(kind: str):
    return vitscope.load_model(kind) if kind.startswith("tiny-") else wrap(make(kind), name=kind)


def reference(b, data: MaskedScenes) -> dict[str, torch.Tensor]:
    """Dataset means computed with vitscope.functional from a plain recording of the same images."""
    spec, p = b.spec, b.spec.num_prefix_tokens
    pixels = b.preprocess([data.get(i).image for i in range(len(data))])
    with torch.no_grad(), b.record("blocks.*.attn.pattern") as rec:
        b(pixels)
        patterns = [rec[f"blocks.{i}.attn.pattern"].clone() for i in range(spec.num_blocks)]
    grid = spec.grid_for(*pixels.shape[-2:])
    out = {
        "distance": torch.stack([F.attention_distance(x, grid, p).mean(0) for x in patterns]),
        "spatial": torch.stack([F.spatial_average_map(x, grid, p).mean(0) for x in patterns]),
        "focus": torch.stack([F.focus_index(x, grid, p).mean(0) for x in patterns]),
        "entropy": torch.stack([F.attention_entropy(x).mean(0) for x in patterns]),
        "rollout": F.rollout(patterns).mean(0),
    }
    if p:
        out["cls"] = torch.stack([F.cls_attention_map(x, grid, p).mean(0) for x in patterns])
    return out


@pytest.mark.parametrize("kind", TRANSFORMER_KINDS + TINY_VITS)
def test_suite_on_every_attention_backbone(kind, scenes):
    b = backbone(kind)
    spec = b.spec
    suite = attention_suite(spec, targets={"masks"}, images=(0,), random_samples=2)
    res = vitscope.run(b, scenes, suite, batch_size=2, device="cpu", progress=False)
    has_cls = spec.num_prefix_tokens > 0 and spec.prefix_kinds[0] == "cls"
    assert ("cls_attention_maps" in res) == has_cls
    assert {"spatial_average_maps", "aligned_attention", "attention_distance", "saliency_iou", "attention_focus",
            "attention_rollout"} <= set(res)
    L, H, (h, w), n = spec.num_blocks, spec.num_heads, spec.grid, spec.num_tokens
    ref = reference(b, scenes)
    tol = {"atol": 2e-5, "rtol": 1e-5}

    torch.testing.assert_close(res["attention_distance"]["distance"].float(), ref["distance"], **tol)
    torch.testing.assert_close(res["spatial_average_maps"]["mean_map"].float(), ref["spatial"], **tol)
    torch.testing.assert_close(res["attention_focus"]["focus"].float(), ref["focus"], **tol)
    torch.testing.assert_close(res["attention_focus"]["entropy"].float(), ref["entropy"], **tol)
    torch.testing.assert_close(res["attention_rollout"]["mean_rollout"].float(), ref["rollout"], **tol)
    if has_cls:
        torch.testing.assert_close(res["cls_attention_maps"]["mean_map"].float(), ref["cls"], **tol)
        assert res["cls_attention_maps"]["image_maps"].shape == (1, L, H, h, w)

    aaam = res["aligned_attention"]["aaam"]
    assert aaam.shape == (L, H, 2 * h - 1, 2 * w - 1)
    torch.testing.assert_close(aaam.sum(dim=(-2, -1)), torch.ones(L, H, dtype=torch.float64), atol=1e-5, rtol=0)
    assert len(res["aligned_attention"].meta["head_types"]) == L
    sal = res["saliency_iou"]
    assert sal.meta["num_images"] + sal.meta["num_empty"] == NUM_IMAGES and sal.meta["num_images"] > 0
    for source in sal.meta["sources"]:
        iou, best = sal[f"{source}_iou"], sal[f"{source}_best_iou"]
        assert iou.shape == (L, H) and bool(((iou >= 0) & (iou <= 1)).all())
        assert bool((best >= iou.amax(dim=-1) - 1e-12).all())  # mean of maxima >= max of means
    assert sal.meta["sources"] == (["cls", "spatial"] if has_cls else ["spatial"])
    assert res["attention_rollout"]["mean_rollout"].shape == (n, n)
    assert all(bool(torch.isfinite(t.double()).all()) for r in res.values() for t in r.tensors.values())
    assert 0.0 < float(res["attention_distance"]["random_distance"].mean()) < math.sqrt(2)


@pytest.mark.parametrize("kind", CNN_KINDS + [t for t in TINY if t.endswith("resnet")])
def test_cnns_have_no_attention(kind, scenes):
    b = backbone(kind)
    with pytest.raises(NoAttentionError, match="no attention"):
        attention_suite(b.spec)
    with pytest.raises(ValueError, match="no attention") as info:
        vitscope.run(b, scenes, [AlignedAttention()], batch_size=2, device="cpu", progress=False)
    assert "\n" not in str(info.value)
    assert not any(getattr(a, "needs_attention", False) for a in default_analyses(b.spec, targets={"masks"}))
