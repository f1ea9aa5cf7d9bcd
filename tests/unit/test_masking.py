"""The masking API: masks from scores, boxes, segmentation and random; pixel filling; token dropping."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vitscope.functional import (
    boxes_pixel_mask,
    fill_pixels,
    frequency_filter,
    masks_bounding_boxes,
    patch_to_pixel_mask,
    pixel_to_patch_mask,
    random_patch_mask,
    score_patch_mask,
)
from vitscope.functional.guided_mask import guided_mask
from vitscope.functional.occlusion import gaussian_blur, masked_count
from vitscope.models.wrap import build_tiny_resnet, build_tiny_vit
from vitscope.occlusion import foreground_pixel_mask, logits_of, masked_logits


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    vit = build_tiny_vit("vit", num_classes=5, image_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2).eval()
    avg = build_tiny_vit("vit-avg", num_classes=5, image_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
                         global_pool="avg", num_reg_tokens=2).eval()
    cnn = build_tiny_resnet("cnn", num_classes=5, image_size=32, widths=(8, 8, 16, 16)).eval()
    return {"vit": vit, "vit-avg": avg, "cnn": cnn}


def test_score_masks_top_bottom_and_ties() -> None:
    scores = torch.tensor([[[0.9, 0.1], [0.5, 0.5]]])
    assert score_patch_mask(scores, 0.25, "top").tolist() == [[[True, False], [False, False]]]
    assert score_patch_mask(scores, 0.25, "bottom").tolist() == [[[False, True], [False, False]]]
    # a tie goes to the lower row-major index; 0.5 of 4 patches = 2
    assert score_patch_mask(scores, 0.5, "bottom").tolist() == [[[False, True], [True, False]]]
    assert int(score_patch_mask(torch.rand(3, 4, 5), 0.3, "top").sum()) == 3 * 6  # floor(0.3*20+0.5)
    with pytest.raises(ValueError, match="order"):
        score_patch_mask(scores, 0.5, "middle")


def test_random_masks_are_seeded_and_exact() -> None:
    a = random_patch_mask(4, (4, 4), 0.5, torch.Generator().manual_seed(0))
    b = random_patch_mask(4, (4, 4), 0.5, torch.Generator().manual_seed(0))
    assert torch.equal(a, b) and (a.flatten(1).sum(1) == 8).all()
    assert not torch.equal(a, random_patch_mask(4, (4, 4), 0.5, torch.Generator().manual_seed(1)))


def test_boxes_and_segmentation_masks() -> None:
    box = boxes_pixel_mask(torch.tensor([[2.0, 1.0, 6.0, 3.0]]), (4, 8))  # x 2..5, y 1..2
    want = torch.zeros(4, 8, dtype=torch.bool)
    want[1:3, 2:6] = True
    assert torch.equal(box, want)
    # a resized box is fractional: pixel centres decide (columns 2.5..4.5 in [2.4, 5.4), row 1.5 in [0.6, 2.4))
    want = torch.zeros(4, 8, dtype=torch.bool)
    want[1, 2:5] = True
    assert torch.equal(boxes_pixel_mask(torch.tensor([[2.4, 0.6, 5.4, 2.4]]), (4, 8)), want)
    masks = torch.zeros(2, 4, 8, dtype=torch.bool)
    masks[0, 1, 2] = masks[0, 2, 5] = True
    assert masks_bounding_boxes(masks).tolist() == [[2.0, 1.0, 6.0, 3.0]]  # the empty mask is dropped
    pix = patch_to_pixel_mask(torch.tensor([[[True, False]]]), (4, 8))
    assert pix[0, :, :4].all() and not pix[0, :, 4:].any()
    assert torch.equal(pixel_to_patch_mask(pix, (1, 2)), torch.tensor([[[True, False]]]))
    third = torch.zeros(1, 4, 4, dtype=torch.bool)
    third[0, :1] = True  # a quarter of the single patch
    assert not pixel_to_patch_mask(third, (1, 1)).any() and pixel_to_patch_mask(third, (1, 1), 0.25).all()


def test_foreground_follows_the_model_geometry(models) -> None:
    spec = models["vit"].spec  # 32 px input; a 64 x 64 image is resized by 1/2
    inst = np.zeros((1, 64, 64), dtype=bool)
    inst[0, 10:20, 30:50] = True
    inst[0, 40:42, 8:10] = True  # a stray blob widens the box
    seg = foreground_pixel_mask(inst, spec, "mask")
    box = foreground_pixel_mask(inst, spec, "box")
    assert seg.shape == (32, 32) and box.shape == (32, 32)
    assert seg[5:10, 15:25].all() and int(seg.sum()) < int(box.sum())
    assert box[5:21, 4:25].all() and not box[:5].any()
    assert not foreground_pixel_mask(np.zeros((0, 64, 64), bool), spec).any()


def test_a_box_the_crop_cuts_keeps_its_part_in_the_frame(models) -> None:
    """A 32 x 64 image is resized to 32 x 64 and cropped to columns 16..47: a thin diagonal object spanning every
    row has a box over every row of the frame, though its pixels left in the crop span rows 8 to 23 only."""
    spec = models["vit"].spec
    inst = np.zeros((1, 32, 64), dtype=bool)
    for y in range(32):
        inst[0, y, 2 * y] = True  # from the top-left corner to the bottom-right
    box = foreground_pixel_mask(inst, spec, "box")
    assert box.shape == (32, 32) and box.all()  # the object's box, x 0..63 and y 0..31, through the crop
    assert not foreground_pixel_mask(inst, spec, "mask")[:8].any()  # its mask: rows 8..23 only


@pytest.mark.parametrize("region", ["mask", "box"])
def test_foreground_follows_a_views_geometry(models, region: str) -> None:
    """A 32 x 64 image letterboxed into the 32 x 32 input: halved, 8 black rows above and below. Its left half
    lands on rows 8..23, columns 0..15 (the model's own resize and crop would give every row, columns 0..15)."""
    from vitscope.analyses.masking.interrelation import background_patches
    from vitscope.models.views import LetterboxView

    spec = models["vit"].spec
    frame = lambda image, resample: LetterboxView().transform(image, spec, resample)  # Batch.frame
    inst = np.zeros((1, 32, 64), dtype=bool)
    inst[0, :, :32] = True
    want = torch.zeros(32, 32, dtype=torch.bool)
    want[8:24, :16] = True
    assert torch.equal(foreground_pixel_mask(inst, spec, region, frame), want)
    assert int(foreground_pixel_mask(inst, spec, region).sum()) == 32 * 16  # without the view: the crop's
    background = np.ones((4, 4), dtype=bool)
    background[1:3, :2] = False  # the 8 x 8 patches on the object
    assert np.array_equal(background_patches(inst, spec, (4, 4), frame), background)
    empty = foreground_pixel_mask(np.zeros((0, 32, 64), dtype=bool), spec, region, frame)
    assert empty.shape == (32, 32) and not empty.any()


def test_fill_modes() -> None:
    x = torch.randn(2, 3, 8, 8)
    mask = torch.zeros(2, 8, 8, dtype=torch.bool)
    mask[:, :4] = True
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    zero = fill_pixels(x, mask, "zero", mean, std)
    torch.testing.assert_close(zero[:, :, 0, 0], torch.tensor([[-2.5, -1.6, -1.0]] * 2))  # black pixels
    assert torch.equal(zero[:, :, 4:], x[:, :, 4:])
    assert (fill_pixels(x, mask, "mean", mean, std)[:, :, :4] == 0).all()
    blurred = fill_pixels(x, mask, "blur", mean, std, blur_sigma=1.0)
    torch.testing.assert_close(blurred[:, :, :4], gaussian_blur(x, 1.0)[:, :, :4])
    const = torch.full((1, 3, 8, 8), 0.7)
    torch.testing.assert_close(gaussian_blur(const, 2.0), const)
    with pytest.raises(ValueError, match="fill"):
        fill_pixels(x, mask, "noise")


@pytest.mark.parametrize("name", ["vit", "vit-avg", "cnn"])
def test_zero_mask_reproduces_outputs_exactly(models, name: str) -> None:
    backbone = models[name]
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    empty = torch.zeros(3, 4, 4, dtype=torch.bool)
    with torch.no_grad():
        ref = logits_of(backbone(x))
        for fill in ("zero", "mean", "blur"):
            assert torch.equal(masked_logits(backbone, x, empty, "pixel", fill=fill), ref)
        ratio0 = score_patch_mask(torch.rand(3, 4, 4), 0.0, "top")
        assert torch.equal(masked_logits(backbone, x, ratio0, "pixel"), ref)
        if backbone.spec.is_transformer:
            assert torch.equal(masked_logits(backbone, x, empty, "drop"), ref)
        else:
            with pytest.raises(ValueError, match="transformer"):
                masked_logits(backbone, x, empty, "drop")


def test_token_dropping_equals_running_on_the_kept_tokens(models) -> None:
    backbone = models["vit"]
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    mask = torch.zeros(2, 4, 4, dtype=torch.bool)
    mask[0, 0] = True  # image 0 drops 4 tokens, image 1 drops 1: run in two groups
    mask[1, 3, 3] = True
    with torch.no_grad():
        got = masked_logits(backbone, x, mask, "drop")
        for i in range(2):
            tokens = backbone.embed(x[i:i + 1])
            keep = torch.cat([torch.tensor([True]), ~mask[i].flatten()])
            want = backbone.head(backbone.final_norm(backbone.run_blocks(tokens[:, keep])))
            torch.testing.assert_close(got[i:i + 1], want)
        # dropping tokens is not the same as filling their pixels
        assert not torch.allclose(got, masked_logits(backbone, x, mask, "pixel"))


def test_frequency_filter() -> None:
    x = torch.rand(2, 3, 16, 12, generator=torch.Generator().manual_seed(0))
    low, high = frequency_filter(x, 3.0, "low"), frequency_filter(x, 3.0, "high")
    torch.testing.assert_close(low + high, x)  # the two filters split the spectrum
    torch.testing.assert_close(frequency_filter(x, 100.0, "low"), x)
    torch.testing.assert_close(frequency_filter(x, 0.0, "low"), x.mean(dim=(-2, -1), keepdim=True).expand_as(x))
    assert high.mean(dim=(-2, -1)).abs().max() < 1e-6  # the high-pass removes the DC term
    # a pure horizontal frequency of 4 cycles passes a low-pass of radius 4 and is stopped by radius 3
    wave = torch.cos(2 * torch.pi * 4 * torch.arange(12) / 12).expand(1, 1, 16, 12)
    torch.testing.assert_close(frequency_filter(wave, 4.0, "low"), wave)
    assert frequency_filter(wave, 3.9, "low").abs().max() < 1e-6


def test_foreground_masking_reads_imagenet_boxes_as_the_boxes_of_the_same_scenes(tmp_path) -> None:
    """Paper 001 masks ImageNet's boxes: a dataset of boxes alone (no masks) gives region="box" the numbers of the
    same scenes with their masks' boxes; region="mask" is refused before the pass."""
    import vitscope
    from vitscope.analyses.masking.foreground import ForegroundMasking
    from vitscope.data.synthetic.write import synthesize
    from vitscope.errors import VitscopeError

    backbone = vitscope.load_model("tiny-vit-sup")
    found = {}
    for fmt in ("coco", "imagenet-boxes"):
        root = synthesize(tmp_path / fmt, fmt, n=8, size=64, seed=3)
        found[fmt] = vitscope.run(backbone, f"{root}::{fmt}", [ForegroundMasking(region="box")], batch_size=4,
                                  progress=False, workers=0)["foreground_masking"]
    assert found["coco"].meta["mean_foreground_fraction"] == found["imagenet-boxes"].meta["mean_foreground_fraction"]
    assert torch.equal(found["coco"].tensors["accuracy"], found["imagenet-boxes"].tensors["accuracy"])
    with pytest.raises(VitscopeError, match="masks"):
        vitscope.run(backbone, f"{tmp_path / 'imagenet-boxes'}::imagenet-boxes", [ForegroundMasking(region="mask")],
                     progress=False, workers=0)


def test_dropping_every_token_of_a_model_without_prefix_is_refused(models) -> None:
    import dataclasses

    from vitscope.occlusion.forward import drop_tokens_logits

    class MeanPooled:  # as I-JEPA's and SigLIP's classifiers: patch tokens only, no CLS
        spec = dataclasses.replace(models["vit"].spec, num_prefix_tokens=0, prefix_kinds=())

        def embed(self, pixels: torch.Tensor) -> torch.Tensor:
            return torch.zeros(len(pixels), 16, 32)

    mask = torch.zeros(2, 4, 4, dtype=torch.bool)
    mask[1] = True  # the second image loses every patch
    with pytest.raises(ValueError, match="no token"):
        drop_tokens_logits(MeanPooled(), torch.zeros(2, 3, 32, 32), mask)


@pytest.mark.parametrize(("ratio", "k", "want"), [(0.7, 165, 116), (0.7, 45, 32), (0.7, 85, 60), (0.7, 345, 242),
                                                   (0.5, 3, 2), (0.25, 2, 1), (0.3, 196, 59), (0.7, 196, 137)])
def test_mask_sizes_round_the_exact_half_up_not_the_float_product(ratio: float, k: int, want: int) -> None:
    # 0.7 * 165 is 115.49999999999999 in floats; floor(ratio * K + 0.5) of the exact 115.5 is 116
    assert masked_count(ratio, k) == want
    assert int(score_patch_mask(torch.arange(float(k)).reshape(1, 1, k), ratio).sum()) == want
    keypoints = torch.zeros(1, k, dtype=torch.long)  # [h, w]
    assert int(guided_mask(keypoints, ratio, 0.5, torch.Generator().manual_seed(0)).sum()) == want
