"""The masking analyses: exact merging, an untouched record, limits, and their group."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from vitscope.analyses.base import Batch
from vitscope.analyses.batch import ModelRunner
from vitscope.analyses.masking.base import NoModelError
from vitscope.analyses.masking.foreground import ForegroundMasking
from vitscope.analyses.masking.frequency import FrequencyFiltering
from vitscope.analyses.masking.interrelation import InterrelationMasking
from vitscope.analyses.params import build_analyses
from vitscope.data.synthetic.world import SyntheticWorld
from vitscope.functional import random_patch_mask
from vitscope.models.views import normalise
from vitscope.models.wrap import build_tiny_resnet, build_tiny_vit
from vitscope.occlusion import logits_of

RATIOS = (0.0, 0.25, 1.0)


@pytest.fixture(scope="module")
def vit():
    return build_tiny_vit("vit", num_classes=5, image_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2).eval()


@pytest.fixture(scope="module")
def cnn():
    return build_tiny_resnet("cnn", num_classes=5, image_size=32, widths=(8, 8, 16, 16)).eval()


@pytest.fixture(scope="module")
def scenes():
    world = SyntheticWorld(num_classes=5, size=32, seed=3)
    return list(world.scenes(6))


def make_batches(backbone, scenes, sizes, own_labels=True):
    """Batches of synthetic scenes; labels = the model's own predictions (full accuracy 1) unless told."""
    out, start = [], 0
    for size in sizes:
        chunk = scenes[start:start + size]
        pixels = backbone.preprocess([s.image for s in chunk])
        masks = [np.stack([o.mask for o in s.objects]) for s in chunk]
        with torch.no_grad():
            labels = logits_of(backbone(pixels)).argmax(-1).tolist() if own_labels else [s.label for s in chunk]
        indices = list(range(start, start + size))
        batch = Batch(pixels=pixels, indices=indices, paths=[str(i) for i in indices], spec=backbone.spec,
                      grid=backbone.spec.grid, targets={"label": labels, "masks": masks})
        out.append(batch)
        start += size
    return out


def feed(acc, backbone, batches):
    """What the engine does: record, forward, hand the batch its model, update."""
    hooks = acc.required_hooks(backbone.spec)
    for batch in batches:
        with backbone.record(hooks) if hooks else _null() as rec, torch.no_grad():
            backbone(batch.pixels)
            batch.model, batch.shared = ModelRunner(backbone, rec), None
            acc.update(rec if rec is not None else {}, batch)
    return acc


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _analyses(backbone):
    out = [ForegroundMasking(topk=(1, 2)), FrequencyFiltering(fractions=(0.1, 0.5, 5.0))]
    if backbone.spec.is_transformer:
        out.insert(0, InterrelationMasking(ratios=RATIOS))
    return out


def _assert_same(a, b) -> None:
    assert set(a.tensors) == set(b.tensors) and a.tensors
    for k in a.tensors:
        torch.testing.assert_close(a.tensors[k], b.tensors[k], equal_nan=True, rtol=1e-9, atol=1e-12)
    assert a.meta == b.meta


@pytest.mark.parametrize("kind", ["vit", "cnn"])
def test_merge_equals_whole_and_state_round_trips(kind, vit, cnn, scenes, one_thread) -> None:
    backbone = vit if kind == "vit" else cnn
    batches = make_batches(backbone, scenes, [2, 3, 1])
    for proto in _analyses(backbone):
        whole = feed(proto.fresh(), backbone, batches).compute()
        first = feed(proto.fresh(), backbone, batches[:2])
        second = feed(proto.fresh(), backbone, batches[2:])
        _assert_same(first.merge(second).compute(), whole)
        clone = pickle.loads(pickle.dumps(first))  # the state holds no model: the batch brings it
        _assert_same(clone.compute(), first.compute())
        twin = proto.fresh()
        twin.load_state_dict(first.state_dict())
        _assert_same(twin.compute(), first.compute())


def test_interrelation_masking_limits(vit, scenes, one_thread) -> None:
    result = feed(InterrelationMasking(ratios=RATIOS), vit, make_batches(vit, scenes, [3, 3])).compute()
    acc = result["accuracy"]  # [top, bottom, random] x ratios
    assert float(result["full_accuracy"]) == 1.0
    assert torch.equal(acc[:, 0], torch.ones(3, dtype=torch.float64))  # 0% masked = the full image
    assert acc[0, 2] == acc[1, 2] == acc[2, 2]  # 100% masked: every order hides everything
    share = result["background_share"]
    assert share.shape == (2, 3) and share[:, 0].isnan().all()  # nothing masked at 0%
    assert 0 <= result.meta["background_share_of_all_patches"] <= 1
    # no ratio in (0, 20%]: the flag is judged at the smallest positive ratio (25%)
    assert result.meta["flagged_background_share"]["top"] == pytest.approx(float(share[0, 1]))
    assert result.meta["flagged_on_background"]["bottom"] == (float(share[1, 1]) >
                                                              result.meta["background_share_of_all_patches"])
    torch.testing.assert_close(share[:, 2], torch.full((2,), result.meta["background_share_of_all_patches"],
                                                       dtype=torch.float64))


@pytest.mark.parametrize("seed", [3, -2, 2**70, -(2**70)])
def test_random_baseline_takes_any_integer_seed(vit, scenes, seed, one_thread) -> None:
    batch = make_batches(vit, scenes, [2])[0]
    masks = InterrelationMasking(seed=seed)._random_masks(batch, 0.5)
    want = [random_patch_mask(1, batch.grid, 0.5, torch.Generator().manual_seed((seed * 1_000_003 + i) % 2**64))
            for i in batch.indices]  # small seeds, negative ones too, draw as torch seeds them unreduced
    assert torch.equal(masks, torch.cat(want))
    result = feed(InterrelationMasking(ratios=(0.5,), seed=seed), vit, [batch]).compute()
    assert result.meta["seed"] == seed and 0 <= float(result["accuracy"][2, 0]) <= 1


def test_labels_beyond_the_head_are_refused(vit, scenes, one_thread) -> None:
    batch = make_batches(vit, scenes, [3])[0]  # 5 classes: label 5 is none of them
    batch.targets["label"] = [0, 5, 1]
    for acc in _analyses(vit):
        with pytest.raises(ValueError, match="label 5 is not one of vit's 5 classes"):
            feed(acc, vit, [batch])
    batch.targets["label"] = [4, 4, 0]  # the last class is one
    assert all(feed(acc, vit, [batch]).compute().meta["num_images"] == 3 for acc in _analyses(vit))


def test_drop_mode_refuses_ratios_that_leave_no_token(vit) -> None:
    # as I-JEPA's and SigLIP's classifiers: no prefix token (the head averages the patches); 16 patches
    mean_pooled = dataclasses.replace(vit.spec, num_prefix_tokens=0, prefix_kinds=())
    assert mean_pooled.grid == (4, 4)
    drop = lambda *ratios: InterrelationMasking(ratios=ratios, mode="drop")
    assert "at ratio 1.0 (16 of 16 patches)" in drop(0.5, 1.0).why_unsupported(mean_pooled)
    assert "at ratio 0.97" in drop(0.97).why_unsupported(mean_pooled)  # floor(0.97 * 16 + 0.5) = 16
    assert drop(0.96).why_unsupported(mean_pooled) is None  # 15 of 16
    assert InterrelationMasking(ratios=(1.0,)).why_unsupported(mean_pooled) is None  # pixel mode fills instead
    assert drop(1.0).why_unsupported(vit.spec) is None  # the CLS token stays


def test_under_a_view_the_foreground_is_placed_by_the_views_geometry(vit, scenes, one_thread) -> None:
    from vitscope.models.views import LetterboxView

    view = LetterboxView()
    image = np.concatenate([scenes[0].image, scenes[1].image], axis=1)  # 32 x 64: letterboxed to 16 x 32
    inst = np.zeros((1, 32, 64), dtype=bool)
    inst[0, :, :32] = True  # its left half: rows 8..23, columns 0..15 of the input, a quarter of it
    pixels = normalise([view.transform(Image.fromarray(image), vit.spec)], vit.spec)
    batch = Batch(pixels=pixels, indices=[0], paths=["0"], spec=vit.spec, grid=vit.spec.grid,
                  targets={"label": [0], "masks": [inst]},
                  frame=lambda image, resample: view.transform(image, vit.spec, resample))
    for region in ("mask", "box"):
        result = feed(ForegroundMasking(region=region, topk=(1,)), vit, [batch]).compute()
        assert result.meta["mean_foreground_fraction"] == 0.25  # without the view's geometry: 0.5
    result = feed(InterrelationMasking(ratios=(0.5,)), vit, [batch]).compute()
    assert result.meta["background_share_of_all_patches"] == 12 / 16  # 4 of the 16 patches on the object


def test_a_view_without_pixels_is_refused_before_the_pass(vit, scenes) -> None:
    import vitscope
    from vitscope.data.memory import InMemoryImages
    from vitscope.models.views import TiledView

    data = InMemoryImages([s.image for s in scenes[:2]], labels=[0, 1])  # the view is refused before the data
    for acc in _analyses(vit):
        with pytest.raises(ValueError, match=f"analysis '{acc.name}' reads each batch's input pixels .* tiled view"):
            vitscope.run(vit, data, [acc], batch_size=2, progress=False, workers=0, view=TiledView())


def test_foreground_and_frequency_limits(vit, scenes, one_thread) -> None:
    batches = make_batches(vit, scenes, [6])
    whole = np.ones((1, 32, 32), dtype=bool)
    covered = [batches[0].__class__(**{**batches[0].__dict__, "targets": {
        "label": batches[0].targets["label"], "masks": [whole] * 6}})]
    fg = feed(ForegroundMasking(topk=(1,)), vit, covered).compute()
    assert fg["accuracy"][:2, 0].tolist() == [1.0, 1.0]  # the foreground is the whole image
    freq = feed(FrequencyFiltering(fractions=(5.0,)), vit, batches).compute()
    assert freq["accuracy"][0, 0] == 1.0  # a low-pass beyond every frequency changes nothing


def test_the_extra_forwards_leave_the_record_untouched(vit, scenes, one_thread) -> None:
    batch = make_batches(vit, scenes, [2])[0]
    acc = InterrelationMasking(ratios=(0.5,))
    with vit.record(["blocks.*.attn.pattern"]) as rec, torch.no_grad():
        vit(batch.pixels)
        before = {k: v.clone() for k, v in rec.items()}
        batch.model = ModelRunner(vit, rec)
        acc.update(rec, batch)
        assert set(rec) == set(before) and all(torch.equal(rec[k], before[k]) for k in before)
        vit(batch.pixels * 0.5)  # a forward outside the runner records as usual
        assert not torch.equal(rec["blocks.0.attn.pattern"], before["blocks.0.attn.pattern"])


def test_model_and_support(vit, cnn, scenes) -> None:
    batch = make_batches(vit, scenes, [1])[0]
    with pytest.raises(NoModelError, match="carries no model"):
        FrequencyFiltering().update({}, batch)
    assert "CNN" in InterrelationMasking().why_unsupported(cnn.spec)
    headless = build_tiny_vit("headless", num_classes=0, image_size=32, patch_size=8, embed_dim=32, depth=1,
                              num_heads=2)
    assert "classifier head" in ForegroundMasking().why_unsupported(headless.spec)
    unlabelled = Batch(pixels=batch.pixels, indices=[0], paths=["0"], spec=vit.spec, grid=vit.spec.grid,
                       model=ModelRunner(vit))
    with pytest.raises(ValueError, match="label"):
        FrequencyFiltering().update({}, unlabelled)


def test_masking_group_keeps_what_can_run(vit, cnn) -> None:
    names = lambda spec, targets: [a.name for a in build_analyses(["masking"], spec, targets)]
    assert names(vit.spec, {"label", "masks"}) == ["interrelation_masking", "foreground_masking",
                                                   "frequency_filtering"]
    assert names(cnn.spec, {"label", "masks"}) == ["foreground_masking", "frequency_filtering"]
    assert names(vit.spec, {"label"}) == ["interrelation_masking", "frequency_filtering"]
    with pytest.raises(ValueError, match="no analysis of the 'masking' group can run"):
        build_analyses(["masking"], vit.spec, set())
