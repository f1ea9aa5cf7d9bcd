"""Preprocessing geometry and normalisation; ViT-MAE keeps every patch in order."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import vitscope
from helpers.hf_factories import make
from vitscope.errors import VitscopeTypeError
from vitscope.models.preprocess import resize_crop


def test_resize_short_side_then_centre_crop():
    spec = vitscope.load_model("tiny-vit").spec  # 64 x 64, resize 64
    img = Image.new("RGB", (200, 100))
    assert resize_crop(img, spec).size == (64, 64)
    # A 128x64 image with a white right half: after resizing to 128x64 the crop keeps columns 32..95.
    arr = np.zeros((64, 128, 3), dtype=np.uint8)
    arr[:, 64:] = 255
    out = np.asarray(resize_crop(Image.fromarray(arr), spec))
    assert (out[:, :32] == 0).all() and (out[:, 32:] == 255).all()


def test_a_strip_is_cropped_before_it_is_resized(monkeypatch):
    """A 60000 x 1 PNG (260 bytes) was resized to 3,840,000 x 64 pixels (737 MB) before its 64 x 64 crop."""
    import vitscope.models.preprocess as preprocess

    spec = vitscope.load_model("tiny-vit").spec
    sizes = []
    resize = Image.Image.resize
    monkeypatch.setattr(Image.Image, "resize",
                        lambda self, size, *a, **k: sizes.append(size) or resize(self, size, *a, **k))
    strip = Image.fromarray(np.tile(np.arange(60000, dtype=np.uint8)[None, :, None], (1, 1, 3)))
    assert resize_crop(strip, spec).size == (64, 64) and max(w * h for w, h in sizes) == 64 * 64
    # the crop box keeps the geometry: on a strip below the bound both ways agree to about a level
    wide = Image.fromarray(np.random.default_rng(0).integers(0, 256, (7, 900, 3), dtype=np.uint8))
    whole = np.asarray(resize_crop(wide, spec), dtype=float)
    monkeypatch.setattr(preprocess, "CROP_FIRST_PIXELS", 64 * 64)
    boxed = np.asarray(resize_crop(wide, spec), dtype=float)
    assert boxed.shape == whole.shape and np.abs(boxed - whole).mean() < 1.0 and sizes[-1] == (64, 64)
    assert np.corrcoef(boxed.ravel(), whole.ravel())[0, 1] > 0.99


def test_normalisation_matches_hand_computation():
    b = vitscope.load_model("tiny-vit")
    img = np.full((64, 64, 3), 128, dtype=np.uint8)
    x = b.preprocess([img])
    mean, std = b.spec.mean, b.spec.std
    for c in range(3):
        torch.testing.assert_close(x[0, c, 0, 0].item(), (128 / 255 - mean[c]) / std[c], rtol=0, atol=1e-6)
    assert x.shape == (1, 3, 64, 64) and x.dtype == torch.float32


def test_a_batch_array_is_its_images_and_other_arrays_are_refused_in_one_line():
    b = vitscope.load_model("tiny-vit")
    batch = np.random.default_rng(0).integers(0, 256, (2, 64, 64, 3), dtype=np.uint8)
    one_by_one = b.preprocess(list(batch))
    assert torch.equal(b.preprocess(batch), one_by_one)
    assert torch.equal(b.preprocess(torch.from_numpy(batch)), one_by_one)
    assert torch.equal(b.preprocess(torch.from_numpy(batch[0])), one_by_one[:1])  # one image, not its 64 rows
    for bad in (np.zeros((3, 64, 64), np.uint8), torch.zeros(3, 64, 64, dtype=torch.uint8),
                np.zeros((1, 2, 64, 64, 3), np.uint8), np.zeros((64, 64, 3))):
        with pytest.raises(VitscopeTypeError, match=r"uint8 arrays \[H, W, 3\] .*, got a \w+ array of shape \["):
            b.preprocess(bad)


def test_mae_is_deterministic_and_unshuffled():
    b = vitscope.wrap(make("mae"))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.manual_seed(1)
        a = b(x).last_hidden_state
        torch.manual_seed(2)
        c = b(x).last_hidden_state
        tokens = b.embed(x)
        emb = b.base.embeddings
        expected = emb.patch_embeddings(x) + emb.position_embeddings[:, 1:]
    assert torch.equal(a, c)
    assert tokens.shape[1] == 1 + 16, "no patch may be masked"
    torch.testing.assert_close(tokens[:, 1:], expected)


def test_a_wrapped_mae_with_transformers_default_mask_ratio_sees_every_patch():
    """A ViTMAEModel built by the user keeps transformers' ``mask_ratio`` 0.75 (three patches in four dropped at
    random); wrapped, it runs as ``load_model`` runs it: every patch, the same output as a ratio of 0."""
    import transformers as tf

    from helpers.hf_factories import SMALL

    model = tf.ViTMAEModel(tf.ViTMAEConfig(**SMALL)).eval()
    assert model.config.mask_ratio == 0.75
    unmasked = make("mae")  # the same weights (seeded), built with mask_ratio 0
    model.load_state_dict(unmasked.state_dict())
    b = vitscope.wrap(model)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad(), b.record(["blocks.0.attn.pattern", "final_norm"]) as rec:
        b(x)
    assert tuple(rec["final_norm"].shape) == (2, 17, 32)
    assert tuple(rec["blocks.0.attn.pattern"].shape) == (2, 2, 17, 17)
    with torch.no_grad():
        torch.testing.assert_close(b(x).last_hidden_state, vitscope.wrap(unmasked)(x).last_hidden_state, atol=0,
                                   rtol=0)
