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
from vitscope.functional import interrelation, interrelation_stages, random_interrelation, sift_keypoint_counts
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
    # the random baseline: every image's KK and NK under the seeded random heads, mean and std over images
    rand = random_interrelation(counts, vit.spec.grid, 1, seed=0, samples=4)
    for q in ("KK", "NK"):
        per_image = rand[q].nanmean(dim=1)
        per_image = per_image[~per_image.isnan()]
        torch.testing.assert_close(result[f"random_{q}_blocks"], per_image.mean().expand(3))
        torch.testing.assert_close(result[f"random_{q}_blocks_std"], per_image.std().expand(3))
    assert result.meta["stages"] == interrelation_stages(result["KK_blocks"], 0.5, result["random_KK_blocks"],
                                                         result["random_KK_blocks_std"], result.meta["band"])
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


def _keypoint_records(setup, focused: int) -> list[dict]:
    """Hand-made patterns: every query attends only keypoint patches at block ``focused``, uniformly elsewhere."""
    vit, images, batches, _ = setup
    counts = torch.stack([sift_keypoint_counts(im, vit.spec.grid) for im in images]).flatten(1)  # [5, K]
    k = counts.shape[1]
    records, start = [], 0
    for b in batches:
        n = len(b.indices)
        on_keys = (counts[start:start + n] > 0).float()  # [n, K]
        rows = {"uniform": torch.ones(n, k), "keypoints": on_keys}
        record = {}
        for block in range(vit.spec.num_blocks):
            spatial = rows["keypoints" if block == focused else "uniform"]
            pattern = torch.zeros(n, 2, k + 1, k + 1)
            pattern[:, :, :, 1:] = (spatial / spatial.sum(-1, keepdim=True))[:, None, None, :]
            record[f"blocks.{block}.attn.pattern"] = pattern
        records.append(record)
        start += n
    return records


def test_a_random_weight_model_has_no_stage_structure_and_says_so(setup) -> None:
    _, _, batches, records = setup  # the tiny ViT of the fixture has random weights
    result = _feed(Interrelation(), batches, records).compute()
    kk, base, spread = result["KK_blocks"], result["random_KK_blocks"], result["random_KK_blocks_std"]
    assert ((kk - base).abs() <= result.meta["band"] * spread).all()  # within the baseline's band at every block
    assert result.meta["has_stages"] is False
    assert result.meta["stages"] == {"retrieval": [], "capture": [], "coach": []}
    verdict = result.meta["stage_structure"]
    assert verdict.startswith("no stage structure") and f"{float(base[0]):.4f}" in verdict
    assert f"{float(kk.min()):.4f}-{float(kk.max()):.4f}" in verdict  # the numbers behind the verdict
    stages = next(f for f in result.figures() if f.stem == "interrelation_stages")
    assert "No stage structure" in stages.caption and not stages.chart.to_json()["panels"][0]["bands"]
    assert result.to_json()["stage_structure"] == verdict  # results.json says it too


def test_a_curve_with_clear_structure_gets_stages(setup) -> None:
    _, _, batches, _ = setup
    result = _feed(Interrelation(), batches, _keypoint_records(setup, focused=1)).compute()
    kk = result["KK_blocks"]
    assert kk[1] == pytest.approx(1.0) and kk[1] > result["random_KK_blocks"][1] + result["random_KK_blocks_std"][1]
    assert result.meta["has_stages"] is True
    assert result.meta["stages"] == {"retrieval": [0], "capture": [1], "coach": [2]}
    assert result.meta["stage_structure"].startswith("stages read from KK") and "block(s) 1 " in \
        result.meta["stage_structure"]
    # a wide enough band takes them away again
    wide = _feed(Interrelation(band=50.0), batches, _keypoint_records(setup, focused=1)).compute()
    assert wide.meta["has_stages"] is False and wide.meta["band"] == 50.0


def test_the_kk_nk_chart_draws_the_random_baseline_and_its_band(setup) -> None:
    _, _, batches, records = setup
    result = _feed(Interrelation(band=2.0), batches, records).compute()
    chart = next(f for f in result.figures() if f.stem == "interrelation_kk_nk").chart.to_json()["panels"][0]
    baselines = [c for c in chart["curves"] if c["baseline"]]
    names = {c["name"] for c in baselines}
    assert names == {"random attention KK (baseline)", "random attention NK (baseline)",
                     "random KK ± 2 std (baseline band)"}
    kk = next(c for c in baselines if c["name"] == "random attention KK (baseline)")
    assert kk["style"] == "dashed" and kk["values"] == pytest.approx(result["random_KK_blocks"].tolist())
    low, high = (c["values"] for c in baselines if c["name"].endswith("(baseline band)"))
    spread = 2.0 * result["random_KK_blocks_std"]
    assert low == pytest.approx((result["random_KK_blocks"] - spread).tolist())
    assert high == pytest.approx((result["random_KK_blocks"] + spread).tolist())
