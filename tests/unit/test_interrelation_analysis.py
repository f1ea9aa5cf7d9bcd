"""The interrelation accumulator on a tiny ViT: matches the functional core, merges exactly, shares the pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("cv2")

from vitscope.analyses.attention.focus import AttentionFocus
from vitscope.analyses.attention.interrelation import Interrelation
from vitscope.analyses.base import Batch
from vitscope.data.synthetic.world import SyntheticWorld
from vitscope.functional import interrelation, interrelation_stages, sift_keypoint_counts
from vitscope.models.preprocess import resize_crop, to_pil
from vitscope.models.wrap import build_tiny_vit


@pytest.fixture(scope="module")
def setup():
    vit = build_tiny_vit("vit", num_classes=5, image_size=64, patch_size=8, embed_dim=32, depth=3, num_heads=2).eval()
    scenes = list(SyntheticWorld(num_classes=5, size=64, seed=5).scenes(5))
    images = [np.asarray(resize_crop(to_pil(s.image), vit.spec)) for s in scenes]
    batches, start = [], 0
    for size in (2, 3):
        pixels = vit.preprocess(images[start:start + size])
        idx = list(range(start, start + size))
        batches.append(Batch(pixels=pixels, indices=idx, paths=[str(i) for i in idx], spec=vit.spec,
                             grid=vit.spec.grid))
        start += size
    records = []
    for b in batches:
        with vit.record(["blocks.*.attn.pattern"]) as rec, torch.no_grad():
            vit(b.pixels)
            records.append(dict(rec.items()))
    return vit, images, batches, records


def _feed(acc, batches, records):
    for b, r in zip(batches, records):
        acc.update(r, b)
    return acc


def test_matches_functional_core_and_merges(setup) -> None:
    vit, images, batches, records = setup
    result = _feed(Interrelation(images=(1, 3)), batches, records).compute()
    counts = torch.stack([sift_keypoint_counts(im, vit.spec.grid) for im in images])
    assert counts.sum() > 0
    per_block = []
    for block in range(vit.spec.num_blocks):
        pattern = torch.cat([r[f"blocks.{block}.attn.pattern"] for r in records])
        per_block.append(interrelation(pattern, counts, vit.spec.grid, 1))
    for q in ("KK", "NK"):
        want = torch.stack([d[q].nanmean(dim=0) for d in per_block])
        torch.testing.assert_close(result[q], want, equal_nan=True)
    torch.testing.assert_close(result["KN"], 1 - result["KK"], equal_nan=True)
    assert result.meta["stages"] == interrelation_stages(result["KK_blocks"])
    assert result.meta["mean_keypoints"] == pytest.approx(float(counts.sum()) / 5)
    assert result["images"].shape == (2, 64, 64, 3) and torch.equal(result["keypoint_counts"], counts[[1, 3]])
    merged = _feed(Interrelation(images=(1, 3)), batches[:1], records[:1]).merge(
        _feed(Interrelation(images=(1, 3)), batches[1:], records[1:])).compute()
    for k in result.tensors:
        torch.testing.assert_close(merged[k], result[k], equal_nan=True)


def test_focus_is_shared_with_the_attention_suite(setup) -> None:
    _, _, batches, records = setup
    inter, focus = Interrelation(), AttentionFocus()
    _feed(inter, batches, records)
    _feed(focus, batches, records)
    torch.testing.assert_close(inter.compute()["focus"], focus.compute()["focus"])


def test_rule_options_change_the_answer(setup) -> None:
    _, _, batches, records = setup
    a = _feed(Interrelation(rule="max", lam=0.5), batches, records).compute()
    b = _feed(Interrelation(rule="uniform", lam=0.5), batches, records).compute()
    assert a.meta["rule"] == "max" and b.meta["rule"] == "uniform"
    assert not torch.allclose(a["KK"], b["KK"], equal_nan=True)
    with pytest.raises(ValueError, match="rule"):
        Interrelation(rule="median")
