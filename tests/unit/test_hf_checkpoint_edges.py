"""Checkpoints whose files disagree with themselves or stretch what a processor JSON may say: vitscope loads what
transformers loads, the same way, or refuses in one line at load time; it never runs a silently different model or
preprocessing."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers as tf
from PIL import Image

import vitscope
from helpers.hf_factories import make
from vitscope.errors import VitscopeValueError
from vitscope.models.errors import ModelLoadError

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
TEXT = dict(SMALL, num_hidden_layers=3)  # a text tower deeper than the vision one: its blocks are not the model's
BASE = {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 32},
        "crop_size": {"height": 32, "width": 32}, "do_center_crop": True, "resample": 3}


def _image(w: int = 70, h: int = 45) -> Image.Image:
    yy, xx = np.mgrid[0:h, 0:w]
    rgb = np.stack([xx * 255 / (w - 1), yy * 255 / (h - 1), (xx * 3 + yy * 2) % 256], -1)
    return Image.fromarray(rgb.astype(np.uint8))


def _with_processor(folder, processor) -> None:
    make("clip").save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))


def _pixels(folder) -> tuple[torch.Tensor, torch.Tensor]:
    """vitscope's input and transformers' for the same image and the same preprocessor_config.json."""
    ours = vitscope.load_model(str(folder)).preprocess([_image()])
    ref = tf.AutoImageProcessor.from_pretrained(folder, backend="pil")(images=[_image()], return_tensors="pt")
    return ours, ref["pixel_values"]


def test_weights_of_more_blocks_than_the_config_says_are_refused(tmp_path):
    torch.manual_seed(0)
    tf.ViTModel(tf.ViTConfig(**dict(SMALL, num_hidden_layers=4), image_size=32, patch_size=8),
                add_pooling_layer=False).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 2}))
    with pytest.raises(ModelLoadError, match=r"hold 2 blocks more than its config.json says: layers 2-3; fix"):
        vitscope.load_model(str(tmp_path))


@pytest.mark.parametrize("build", [
    lambda: tf.CLIPModel(tf.CLIPConfig(vision_config=dict(SMALL, image_size=32, patch_size=8), text_config=TEXT)),
    lambda: tf.SiglipModel(tf.SiglipConfig(vision_config=dict(SMALL, image_size=32, patch_size=8), text_config=TEXT)),
], ids=["clip", "siglip"])
def test_a_full_image_text_checkpoint_loads_its_vision_tower(tmp_path, build):
    """The text tower and the logit scale stay unused, as they should: only the vision module is loaded."""
    torch.manual_seed(0)
    build().save_pretrained(tmp_path)
    assert vitscope.load_model(str(tmp_path)).spec.num_blocks == 2


def test_a_full_checkpoint_whose_vision_config_is_short_of_blocks_is_refused(tmp_path):
    torch.manual_seed(0)
    tf.CLIPModel(tf.CLIPConfig(vision_config=dict(SMALL, image_size=32, patch_size=8), text_config=TEXT)
                 ).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["vision_config"]["num_hidden_layers"] = 1
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"hold 1 block more than its config.json says: .*layers 1; fix"):
        vitscope.load_model(str(tmp_path))


@pytest.mark.parametrize("stats", [
    {"image_mean": [0.4, 0.45, 0.5]},  # image_std left out: the class's default
    {"image_mean": 0.5, "image_std": 0.25},  # one number for every channel
    {},  # both left out: the class's defaults
], ids=["std-left-out", "scalar", "none"])
def test_mean_and_std_are_read_as_transformers_reads_them(tmp_path, stats):
    _with_processor(tmp_path, {**BASE, **stats})
    ours, ref = _pixels(tmp_path)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("stats", "message"), [
    ({"image_mean": [0.5, 0.5]}, r"image_mean must be 3 numbers \(or one for every channel\), got \[0.5, 0.5\]"),
    ({"image_mean": [0.5] * 3, "image_std": "wide"}, r"image_std must be 3 numbers .*got \"wide\""),
    ({"image_mean": None}, r"image_mean is null while do_normalize is on"),
], ids=["two-numbers", "a-word", "null"])
def test_mean_and_std_transformers_refuses_are_refused_at_load(tmp_path, stats, message):
    _with_processor(tmp_path, {**BASE, **stats})
    with pytest.raises(VitscopeValueError, match=r"^preprocessor_config.json: " + message):
        vitscope.load_model(str(tmp_path))


def test_a_processor_json_that_is_not_an_object_is_refused(tmp_path):
    make("clip").save_pretrained(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text("[1, 2]")
    with pytest.raises(VitscopeValueError, match=r"preprocessor_config.json holds a JSON list, not an object"):
        vitscope.load_model(str(tmp_path))


@pytest.mark.parametrize("flag", [False, None], ids=["false", "null"])
def test_a_processor_that_does_not_resize_is_refused(tmp_path, flag):
    """transformers would crop each image at its own size; vitscope resizes first, so it says it cannot follow."""
    _with_processor(tmp_path, {**BASE, "do_resize": flag})
    with pytest.raises(VitscopeValueError, match=r"^preprocessor_config.json: do_resize is (false|null): "):
        vitscope.load_model(str(tmp_path))


@pytest.mark.parametrize("flag", [False, None], ids=["false", "null"])
def test_a_short_side_resize_without_a_crop_says_the_square_crop_it_adds(tmp_path, flag):
    """transformers gives a 40 x 62 input; vitscope, one input size for every image, its centre 40 x 40, and says
    so rather than crop to the config's 32 px unsaid."""
    _with_processor(tmp_path, {**BASE, "size": {"shortest_edge": 40}, "do_center_crop": flag})
    b = vitscope.load_model(str(tmp_path))
    assert (b.spec.image_size, b.spec.resize_size) == ((40, 40), 40)
    assert b.spec.preprocessing.endswith("; centre crop to 40x40 px added (no crop in the processor)")
    ours, ref = _pixels(tmp_path)
    assert tuple(ref.shape[-2:]) == (40, 62)
    torch.testing.assert_close(ours, ref[..., 11:51], atol=1e-5, rtol=0)
