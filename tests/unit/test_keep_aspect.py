"""Each image at its own aspect ratio under a token budget (``--keep-aspect``, SigLIP 2 NaFlex): the resize rule,
hand-computed and against the published processor's, the grouped pixels, and what refuses it."""

from __future__ import annotations

import random

import numpy as np
import pytest
from PIL import Image

import vitscope
from helpers.hf_factories import make
from vitscope import wrap
from vitscope.errors import VitscopeValueError
from vitscope.models.input_size import describe_input, keeping_aspect
from vitscope.models.preprocess import aspect_size, frame_size, pixel_groups, resize_crop, resized_pixels


def test_the_rule_by_hand():
    # 40x80 px, patches of 8, at most 16: a scale of 0.6 gives 3x5 patches (15); any more gives 3x6 or 4x6 (> 16)
    assert aspect_size((40, 80), 8, 16) == (24, 40)
    assert aspect_size((64, 64), 8, 16) == (32, 32)  # a square: the model's own 4x4 grid
    assert aspect_size((10, 1000), 8, 16) == (8, 128)  # at least one patch on the short side: 1x16
    assert aspect_size((1000, 1000), 16, 256) == (256, 256)  # a large image is reduced
    with pytest.raises(VitscopeValueError, match="at least 1"):
        aspect_size((10, 10), 8, 0)


def test_the_rule_equals_the_published_processors():
    """``Siglip2ImageProcessor``'s own size rule (transformers' ``get_image_size_for_max_num_patches``)."""
    published = pytest.importorskip("transformers.models.siglip2.image_processing_pil_siglip2")
    rng = random.Random(0)
    for _ in range(500):
        h, w, patch, budget = rng.randint(1, 1500), rng.randint(1, 1500), rng.choice([8, 14, 16]), \
            rng.choice([16, 64, 256, 576, 1024])
        assert aspect_size((h, w), patch, budget) == published.get_image_size_for_max_num_patches(h, w, patch, budget)


def test_images_of_several_sizes_come_in_groups():
    b = keeping_aspect(wrap(make("dinov2"), name="dinov2"))
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)) for h, w in
              [(40, 80), (64, 64), (40, 80), (80, 40)]]
    groups = pixel_groups(images, b.spec)
    assert [(positions, tuple(p.shape)) for positions, p in groups] == [
        ([0, 2], (2, 3, 24, 40)), ([1], (1, 3, 32, 32)), ([3], (1, 3, 40, 24))]
    for positions, pixels in groups:  # each image as it alone would be preprocessed; its frame as predicted
        for j, i in enumerate(positions):
            assert np.array_equal(pixels[j].permute(1, 2, 0).numpy(), np.asarray(resize_crop(images[i], b.spec)))
            assert frame_size((images[i].height, images[i].width), b.spec) == tuple(pixels.shape[-2:])
    with pytest.raises(VitscopeValueError, match=r"make 3 input sizes \(24x40, 32x32, 40x24 px\)"):
        resized_pixels(images, b.spec)


def test_what_keeps_its_aspect_and_what_refuses():
    b = wrap(make("dinov2"), name="dinov2")
    kept = keeping_aspect(b)
    assert kept.spec.max_tokens == 16 and b.spec.max_tokens is None and kept.model is b.model
    assert "aspect ratio kept, at most 16 patches of 8 px per image" in describe_input(kept.spec)
    assert "max_tokens" not in b.spec.to_dict() and kept.spec.to_dict()["max_tokens"] == 16
    with pytest.raises(VitscopeValueError, match="is a CNN; --keep-aspect applies to vision transformers"):
        keeping_aspect(vitscope.load_model("tiny-resnet-sup"))
    with pytest.raises(VitscopeValueError, match="so it cannot keep each image's aspect ratio"):
        keeping_aspect(wrap(make("aimv2"), name="aimv2"))
