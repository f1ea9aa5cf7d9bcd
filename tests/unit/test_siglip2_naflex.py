"""SigLIP 2 NaFlex: vitscope's inputs are the published processor's, and the tokens of an image are those of the
processor's padded batch with the padding left out (so no analysis, probe or map ever sees a padding token)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import vitscope
from helpers.hf_factories import make, peaked
from vitscope import wrap
from vitscope.models.families.siglip2 import patchify
from vitscope.models.preprocess import normalise_pixels, pixel_groups

processing = pytest.importorskip("transformers.models.siglip2.image_processing_pil_siglip2")
SIZES = [(40, 80), (64, 64), (30, 90)]  # grids 3x5, 4x4 and 2x7 under 16 patches of 8 px


@pytest.fixture
def images() -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)) for h, w in SIZES]


def processor():
    return processing.Siglip2ImageProcessorPil(patch_size=8, max_num_patches=16)


def test_the_inputs_are_the_published_processors(images):
    b = wrap(make("siglip2"), name="siglip2")
    ref = processor()(images, return_tensors="pt")
    groups = {i: (pixels, j) for positions, pixels in pixel_groups(images, b.spec) for j, i in enumerate(positions)}
    for i in range(len(images)):
        pixels, j = groups[i]
        h, w = (s // 8 for s in pixels.shape[-2:])
        assert ref["spatial_shapes"][i].tolist() == [h, w]
        ours = patchify(normalise_pixels(pixels[j:j + 1], b.spec), 8)[0]
        valid = ref["pixel_attention_mask"][i].bool()
        assert int(valid.sum()) == h * w and not valid[h * w:].any()
        torch.testing.assert_close(ours, ref["pixel_values"][i][valid].float(), atol=1e-6, rtol=0)


def test_an_image_has_the_tokens_of_the_padded_batch_without_the_padding(images):
    """The HF model on the processor's batch (three grids padded to 16 tokens) vs vitscope on each image alone:
    every real token's output and attention row equal to 1e-5, with attention far from uniform."""
    model = peaked(make("siglip2", attn_implementation="eager"))
    b = wrap(model, name="siglip2")
    ref = processor()(images, return_tensors="pt")
    assert int(ref["pixel_attention_mask"].sum()) < ref["pixel_attention_mask"].numel()  # padding to leave out
    with torch.no_grad():
        out = model(**ref, output_attentions=True)
    for i, image in enumerate(images):
        (_, pixels), = pixel_groups([image], b.spec)
        with torch.no_grad(), b.record(["final_norm", "blocks.*.attn.pattern"]) as rec:
            b(normalise_pixels(pixels, b.spec))
        valid = ref["pixel_attention_mask"][i].bool()
        k = int(valid.sum())
        assert rec["final_norm"].shape[1] == k  # no padding token at all
        torch.testing.assert_close(rec["final_norm"][0], out.last_hidden_state[i][valid], atol=1e-5, rtol=0)
        for block, attention in enumerate(out.attentions):
            mine = rec[f"blocks.{block}.attn.pattern"][0]
            torch.testing.assert_close(mine, attention[i][:, valid][:, :, valid], atol=1e-5, rtol=0)
            assert float(attention[i][:, valid][:, :, ~valid].abs().sum()) == 0.0  # padding gets no attention
        assert float(rec["blocks.1.attn.pattern"].amax(-1).mean()) > 3.0 / k


def test_a_checkpoint_sets_the_token_budget(tmp_path):
    make("siglip2").save_pretrained(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Siglip2ImageProcessor", "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
        "resample": 2, "patch_size": 8, "max_num_patches": 25}))
    spec = vitscope.load_model(str(tmp_path)).spec
    assert spec.max_tokens == 25 and spec.image_size == (40, 40) and spec.grid == (5, 5)
    assert spec.interpolation == "bilinear" and spec.preprocessing.startswith("checkpoint processor")
    assert vitscope.load_model(str(tmp_path), image_size=48).spec.max_tokens == 36  # --image-size: 6x6 patches


def test_a_pair_of_two_aspect_ratios_is_explained_on_each_images_own_grid(images, tmp_path):
    """explain-pair: each image's similarity map on its own grid (NaFlex keeps aspect ratios by itself)."""
    from vitscope.explain.pair_report import write_pair_report

    make("siglip2").save_pretrained(tmp_path / "model")
    for i in (0, 1):
        images[i].save(tmp_path / f"{i}.png")
    doc = write_pair_report(str(tmp_path / "model"), tmp_path / "0.png", tmp_path / "1.png", tmp_path / "out")
    summary = doc["analyses"]["paired_similarity"]["summary"]
    assert summary["grid"] == [3, 5] and summary["grid_b"] == [4, 4]
    maps = np.load(tmp_path / "out" / "arrays" / "paired_similarity.npz")
    assert maps["map_a"].shape[-2:] == (3, 5) and maps["map_b"].shape[-2:] == (4, 4)
