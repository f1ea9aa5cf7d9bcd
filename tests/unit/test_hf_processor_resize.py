"""A checkpoint's preprocessor_config.json gives the pixels its own transformers image processor gives: the same
resize (the whole image to a fixed height and width, or the short side), crop and normalisation, checked against
the processor transformers itself loads from the same JSON (``AutoImageProcessor.from_pretrained``, its PIL
backend) on a photo-sized gradient, so a setting read otherwise than transformers reads it shows."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers as tf
from PIL import Image

import vitscope
from helpers.hf_factories import make


def _gradient(w: int = 640, h: int = 427) -> Image.Image:
    """Red follows the column, green the row: any shift, squash or crop of the image changes the pixels."""
    yy, xx = np.mgrid[0:h, 0:w]
    rgb = np.stack([xx * 255 / (w - 1), yy * 255 / (h - 1), np.full_like(xx, 128)], -1)
    return Image.fromarray(rgb.astype(np.uint8))


def _checkpoint(tmp_path, kind: str, processor: dict):
    make(kind).save_pretrained(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(processor))
    return vitscope.load_model(str(tmp_path))


def _reference(folder):
    """The processor transformers loads from the folder's preprocessor_config.json: the ground truth."""
    return tf.AutoImageProcessor.from_pretrained(folder, backend="pil")


def _same_pixels(b, proc, image: Image.Image, atol: float = 1e-5) -> None:
    ours = b.preprocess([image])
    ref = proc(images=[image], return_tensors="pt")["pixel_values"]
    assert ours.shape == ref.shape
    torch.testing.assert_close(ours, ref, atol=atol, rtol=0)


# the JSON a checkpoint ships: fixed height and width, with and without a crop after it
FIXED = [
    {"image_processor_type": "ViTImageProcessor", "size": {"height": 224, "width": 224}, "image_mean": [0.5] * 3,
     "image_std": [0.5] * 3, "resample": 2},
    {"image_processor_type": "SiglipImageProcessor", "do_resize": True, "size": {"height": 64, "width": 96},
     "image_mean": [0.5] * 3, "image_std": [0.5] * 3, "resample": 3},
    {"image_processor_type": "DeiTImageProcessor", "size": {"height": 256, "width": 256},
     "crop_size": {"height": 224, "width": 224}, "do_center_crop": True, "resample": 3,
     "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]},
    {"image_processor_type": "BeitImageProcessor", "size": {"height": 224, "width": 224},
     "crop_size": {"height": 224, "width": 224}, "do_center_crop": False, "resample": 2, "image_mean": [0.5] * 3,
     "image_std": [0.5] * 3},
    # older checkpoints: a bare number, which these classes read as height and width (google/vit-base-patch16-224,
    # facebook/deit-base-distilled-patch16-224)
    {"feature_extractor_type": "ViTFeatureExtractor", "size": 224, "resample": 2, "image_mean": [0.5] * 3,
     "image_std": [0.5] * 3},
    {"feature_extractor_type": "DeiTFeatureExtractor", "size": 256, "crop_size": 224, "do_center_crop": True,
     "resample": 3, "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]},
]


@pytest.mark.parametrize("processor", FIXED, ids=["vit", "siglip-64x96", "deit", "beit", "vit-int", "deit-int"])
def test_a_fixed_size_resizes_the_whole_image(tmp_path, processor):
    b = _checkpoint(tmp_path, "vit", processor)
    size = processor["size"]
    hw = (size["height"], size["width"]) if isinstance(size, dict) else (size, size)
    assert b.spec.resize_size == hw
    _same_pixels(b, _reference(tmp_path), _gradient())
    _same_pixels(b, _reference(tmp_path), _gradient(300, 500))  # portrait


def test_the_whole_image_is_seen_not_its_centre():
    """A 640x427 image resized to 224x224 keeps its left and right columns: the processor squashes it."""
    from vitscope.models.preprocess import resize_crop_geometry
    from vitscope.models.spec import ModelSpec

    spec = ModelSpec(name="m", family="vit", kind="transformer", num_blocks=1, num_heads=1, embed_dim=8, mlp_dim=8,
                     patch_size=16, grid=(14, 14), num_prefix_tokens=1, prefix_kinds=("cls",), image_size=(224, 224),
                     resize_size=(224, 224))
    assert resize_crop_geometry((427, 640), spec) == ((224, 224), 0, 0)


def test_a_fixed_size_is_said_and_moves_with_the_input_size(tmp_path):
    from vitscope.models.input_size import describe_input, with_image_size

    b = _checkpoint(tmp_path, "vit", {"image_processor_type": "DeiTImageProcessor",
                                      "size": {"height": 40, "width": 40}, "crop_size": {"height": 32, "width": 32},
                                      "do_center_crop": True})
    assert "whole image resized to 40x40 px, centre crop" in describe_input(b.spec)
    wide = with_image_size(b, (32, 64))
    assert wide.spec.resize_size == (40, 80) and wide.spec.image_size == (32, 64)
    assert tuple(wide.preprocess([_gradient()]).shape) == (1, 3, 32, 64)


# a JSON that leaves do_center_crop out (transformers 5 saves an unset one so): the processor class's default
# decides, no crop for ViT, SigLIP and BEiT, a crop for DeiT and CLIP (of its default 224 px when crop_size is left
# out too); set to null, it is off whatever the class (transformers keeps the None)
CLASS_DEFAULT_CROP = [
    ({"image_processor_type": "ViTImageProcessor", "size": {"height": 40, "width": 40},
      "crop_size": {"height": 32, "width": 32}}, (40, 40)),
    ({"image_processor_type": "ViTImageProcessor", "size": {"height": 40, "width": 40},
      "crop_size": {"height": 32, "width": 32}, "do_center_crop": None}, (40, 40)),
    ({"image_processor_type": "SiglipImageProcessor", "size": {"height": 40, "width": 48},
      "crop_size": {"height": 32, "width": 32}}, (40, 48)),
    ({"image_processor_type": "BeitImageProcessor", "size": {"height": 40, "width": 40},
      "crop_size": {"height": 32, "width": 32}}, (40, 40)),
    ({"image_processor_type": "DeiTImageProcessor", "size": {"height": 40, "width": 40},
      "crop_size": {"height": 32, "width": 32}}, (32, 32)),
    ({"image_processor_type": "DeiTImageProcessor", "size": {"height": 40, "width": 40},
      "crop_size": {"height": 32, "width": 32}, "do_center_crop": None}, (40, 40)),
    ({"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 256}, "do_center_crop": True},
     (224, 224)),
]


@pytest.mark.parametrize(("processor", "input_hw"), CLASS_DEFAULT_CROP,
                         ids=["vit", "vit-null", "siglip", "beit", "deit", "deit-null", "clip-no-crop-size"])
def test_a_setting_left_out_is_the_processor_class_default(tmp_path, processor, input_hw):
    processor = {**processor, "resample": 3, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}
    b = _checkpoint(tmp_path, "vit", processor)
    assert b.spec.image_size == input_hw
    _same_pixels(b, _reference(tmp_path), _gradient())


def test_a_saved_processor_without_do_center_crop_is_not_cropped(tmp_path):
    """What transformers itself writes: ViTImageProcessor's save_pretrained leaves out an unset do_center_crop."""
    make("vit").save_pretrained(tmp_path)
    proc = tf.ViTImageProcessorPil(size={"height": 40, "width": 40}, crop_size={"height": 32, "width": 32},
                                   image_mean=[0.5] * 3, image_std=[0.5] * 3)
    proc.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "preprocessor_config.json").read_text()).get("do_center_crop") is None
    b = vitscope.load_model(str(tmp_path))
    assert (b.spec.image_size, b.spec.grid) == ((40, 40), (5, 5))
    _same_pixels(b, _reference(tmp_path), _gradient())


# do_normalize, do_rescale and rescale_factor: the model gets (x * rescale_factor - mean) / std, as from the processor
SCALES = [
    ({"do_normalize": False}, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0), "; not normalised (do_normalize false)"),
    ({"do_rescale": False}, (0.5 / 255,) * 3, (0.25 / 255,) * 3, "; pixels 0-255 (do_rescale false)"),
    ({"rescale_factor": 1 / 127.5}, (0.25,) * 3, (0.125,) * 3, "; pixels times 0.00784314 (rescale_factor)"),
    ({"do_normalize": False, "rescale_factor": 1 / 127.5}, (0.0,) * 3, (0.5,) * 3,
     "; not normalised (do_normalize false); pixels times 0.00784314 (rescale_factor)"),
    ({"rescale_factor": 0.00392156862745098}, (0.5,) * 3, (0.25,) * 3, ""),  # 1 / 255 as transformers writes it
    ({"do_normalize": None, "do_rescale": None}, (0.0,) * 3, (1 / 255,) * 3,  # null: off, as transformers keeps it
     "; not normalised (do_normalize null); pixels 0-255 (do_rescale null)"),
]


@pytest.mark.parametrize(("flags", "mean", "std", "note"), SCALES,
                         ids=["no-normalize", "no-rescale", "rescale-2", "both", "default-factor", "null"])
def test_rescale_and_normalize_flags_are_followed(tmp_path, flags, mean, std, note):
    processor = {"image_processor_type": "ViTImageProcessor", "size": {"height": 32, "width": 32}, "resample": 2,
                 "image_mean": [0.5] * 3, "image_std": [0.25] * 3, **flags}
    b = _checkpoint(tmp_path, "vit", processor)
    assert b.spec.preprocessing == "checkpoint processor (preprocessor_config.json)" + note
    torch.testing.assert_close(b.spec.mean, mean, atol=1e-12, rtol=0)
    torch.testing.assert_close(b.spec.std, std, atol=1e-12, rtol=0)
    ref = _reference(tmp_path)(images=[_gradient()], return_tensors="pt")["pixel_values"].float()  # uint8 unscaled
    torch.testing.assert_close(b.preprocess([_gradient()]), ref, atol=1e-5 * float(ref.abs().max()), rtol=0)


@pytest.mark.parametrize("resample", [0, 1, 2, 3, 4, 5])
def test_every_pil_filter_a_processor_names_resizes_as_it_does(tmp_path, resample):
    """0-5: nearest, lanczos, bilinear, bicubic, box and hamming, all of which transformers' processors accept."""
    processor = {"image_processor_type": "ViTImageProcessor", "size": {"height": 40, "width": 48},
                 "resample": resample, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}
    b = _checkpoint(tmp_path, "vit", processor)
    _same_pixels(b, _reference(tmp_path), _gradient())


def test_an_unknown_interpolation_is_refused_when_the_model_is_made():
    from dataclasses import replace

    from vitscope.errors import VitscopeValueError

    spec = vitscope.load_model("tiny-vit").spec
    with pytest.raises(VitscopeValueError, match=r"unknown interpolation 'cubic' for tiny-vit; use one of nearest, "):
        replace(spec, interpolation="cubic")


# ConvNeXt's processor (HF ResNet and ConvNeXt checkpoints): the short side to shortest_edge / crop_pct, then a
# centre crop of shortest_edge; from 384 px, the whole image to shortest_edge x shortest_edge
CROP_PCT = [
    ({"image_processor_type": "ConvNextImageProcessor", "size": {"shortest_edge": 224}, "crop_pct": 0.875,
      "resample": 3}, 256, (224, 224)),
    ({"feature_extractor_type": "ConvNextFeatureExtractor", "size": 224, "crop_pct": 0.875, "resample": 3}, 256,
     (224, 224)),  # microsoft/resnet-50: a bare number, the short side for this class
    ({"image_processor_type": "ConvNextImageProcessor", "size": {"shortest_edge": 160}, "crop_pct": 0.95,
      "resample": 2}, 168, (160, 160)),
    ({"image_processor_type": "ConvNextImageProcessor", "size": {"shortest_edge": 384}, "crop_pct": 0.875,
      "resample": 3}, (384, 384), (384, 384)),
]


@pytest.mark.parametrize(("processor", "resize", "crop"), CROP_PCT, ids=["224", "224-int", "160-0.95", "384"])
def test_convnext_processors_resize_to_size_over_crop_pct(tmp_path, processor, resize, crop):
    processor = {**processor, "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}
    b = _checkpoint(tmp_path, "resnet", processor)
    assert (b.spec.resize_size, b.spec.image_size) == (resize, crop)
    _same_pixels(b, _reference(tmp_path), _gradient(640, 480))  # 341.33 px wide at 256: no tie


def _timm_module(**cfg):
    from vitscope.models.tiny import TinyViT, TinyViTConfig

    m = TinyViT(TinyViTConfig(num_classes=3))  # a 64 px input
    m.pretrained_cfg = {"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "interpolation": "bicubic",
                        "input_size": (3, 64, 64), **cfg}
    return m


@pytest.mark.parametrize(("cfg", "resize"), [
    ({"crop_pct": 0.875, "crop_mode": "center"}, 73),  # timm: floor(64 / 0.875) = 73, the short side, then crop 64
    ({"crop_pct": 0.9}, 71),  # crop_mode center by default
    ({"crop_pct": 0.875, "crop_mode": "squash"}, (73, 73)),  # every side to 73, then crop 64
    ({"crop_pct": 1.0}, 64),
    ({}, None),  # nothing said: the short side to the input size
])
def test_timm_pretrained_cfg_crop_pct(cfg, resize):
    from vitscope.models.preprocess import resize_crop_geometry

    b = vitscope.wrap(_timm_module(**cfg), "timm")
    assert b.spec.resize_size == resize and b.spec.image_size == (64, 64)
    new_hw, left, top = resize_crop_geometry((480, 640), b.spec)
    if resize == 73:
        assert (new_hw, left, top) == ((73, 97), 16, 4)
    if resize == (73, 73):
        assert (new_hw, left, top) == ((73, 73), 4, 4)


def test_the_short_side_resize_truncates_the_long_side_as_transformers_does(tmp_path):
    """A 640x427 photo at a short side of 224 is 335 px wide for transformers (int(224 * 640 / 427) = int(335.7)),
    so its crop starts at column 55; and so for every size a processor meets."""
    from transformers.image_transforms import get_resize_output_image_size

    from vitscope.models.preprocess import resize_crop_geometry

    processor = {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 224},
                 "crop_size": {"height": 224, "width": 224}, "do_center_crop": True, "resample": 3,
                 "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}
    b = _checkpoint(tmp_path, "clip", processor)
    assert b.spec.resize_rule == "transformers"
    assert resize_crop_geometry((427, 640), b.spec) == ((224, 335), 55, 0)
    proc = _reference(tmp_path)
    _same_pixels(b, proc, _gradient(640, 427))
    _same_pixels(b, proc, _gradient(427, 640))
    for h, w in [(427, 640), (375, 500), (480, 1000), (333, 225), (1023, 767)]:
        hf = get_resize_output_image_size(np.zeros((3, h, w)), 224, default_to_square=False,
                                          input_data_format="channels_first")
        assert resize_crop_geometry((h, w), b.spec)[0] == tuple(hf), (h, w)


def test_convnext_on_a_photo_whose_width_would_round_up(tmp_path):
    processor = {"image_processor_type": "ConvNextImageProcessor", "size": {"shortest_edge": 224}, "crop_pct": 0.875,
                 "resample": 3, "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}
    b = _checkpoint(tmp_path, "resnet", processor)
    proc = _reference(tmp_path)
    _same_pixels(b, proc, _gradient(640, 427))  # int(256 * 640 / 427) = int(383.7)


def test_timm_rounds_as_torchvision():
    """timm's Resize(73) truncates the long side and its CenterCrop rounds the offset: a 651x480 image becomes
    99x73 (73 * 651 / 480 = 99.006), cropped from column round(17.5) = 18 where transformers would take 17."""
    from vitscope.models.preprocess import resize_crop_geometry

    b = vitscope.wrap(_timm_module(crop_pct=0.875), "timm")
    assert b.spec.resize_rule == "torchvision"
    assert resize_crop_geometry((480, 651), b.spec) == ((73, 99), 18, 4)
    assert resize_crop_geometry((480, 640), b.spec) == ((73, 97), 16, 4)  # int(97.3); round(16.5) = 16 (to even)


def test_vitscope_own_models_keep_their_rule():
    """The tiny zoo was trained on vitscope's own resize, which rounds the long side: 64 * 640 / 427 = 95.9 -> 96."""
    from vitscope.models.preprocess import resize_crop_geometry

    spec = vitscope.load_model("tiny-vit").spec
    assert spec.resize_rule == "vitscope" and "resize_rule" not in spec.to_dict()
    assert resize_crop_geometry((427, 640), spec) == ((64, 96), 16, 0)
