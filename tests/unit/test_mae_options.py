"""MAE's experimental options: a CLS-only decoder input and pooled targets (docs/zoo-findings.md, session 11)."""

import pytest
import torch

from vitscope.models.wrap import build_tiny_vit
from vitscope.train.data import TensorImages, synthetic_split
from vitscope.train.loop import LoopConfig, fit
from vitscope.train.mae import MAEConfig, MAEDecoder, MAERecipe, patchify, pooled_patches


@pytest.fixture(scope="module")
def data() -> TensorImages:
    return synthetic_split(64, seed=5, size=32)


def _vit():
    return build_tiny_vit("t", image_size=32, depth=2, embed_dim=32, num_heads=2, num_classes=0)


def _mae(**kw) -> MAERecipe:
    return MAERecipe(_vit(), MAEConfig(lr=3e-3, warmup=1, decoder_dim=32, **kw))


def test_pooled_patches_by_hand():
    images = torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).reshape(2, 3, 4, 4)
    torch.testing.assert_close(pooled_patches(images, 2, 1), patchify(images, 2))
    means = pooled_patches(images, 2, 2)  # [2, 4 patches, 3 channels]: each patch's mean colour
    assert means.shape == (2, 4, 3)
    # Patch 1 (top right) of image 0, channel 0: pixels (0,2) (0,3) (1,2) (1,3) = 2, 3, 6, 7.
    assert means[0, 1, 0] == pytest.approx(4.5)
    assert means[1, 3, 2] == pytest.approx(float(images[1, 2, 2:, 2:].mean()))
    assert pooled_patches(torch.zeros(1, 3, 8, 8), 4, 2).shape == (1, 4, 2 * 2 * 3)


def test_decoder_predicts_the_pooled_patch_size():
    assert _mae(target_pool=2).decoder.pred.out_features == (8 // 2) ** 2 * 3  # build_tiny_vit: patch 8 at 32 px
    assert _mae().decoder.pred.out_features == 8 * 8 * 3


def test_decoder_without_visible_tokens_depends_on_the_prefix_alone():
    decoder = MAEDecoder(16, (2, 2), 4, 16, 1, 2).eval()
    cls = torch.randn(1, 1, 16).expand(3, 1, 16)  # three images with the same CLS
    with torch.no_grad():
        out = decoder(cls, torch.zeros(3, 0, dtype=torch.long), 4, 1)
        other = decoder(cls + 1.0, torch.zeros(3, 0, dtype=torch.long), 4, 1)
    assert out.shape == (3, 4, 4 * 4 * 3)
    torch.testing.assert_close(out[0], out[2])
    assert not torch.allclose(out, other)


@pytest.mark.parametrize("decoder_input, seen", [("tokens", 1 + 4), ("cls", 1)])  # 16 patches, 25% visible
def test_cls_input_hands_the_decoder_the_cls_token_only(data, decoder_input, seen):
    recipe = _mae(decoder_input=decoder_input)
    shapes = []
    recipe.decoder.register_forward_pre_hook(lambda mod, args: shapes.append((args[0].shape[1], args[1].shape[1])))
    with torch.no_grad():
        recipe.loss(data.images[:4], data.labels[:4], 0, torch.Generator().manual_seed(0))
    assert shapes == [(seen, seen - 1)]


@pytest.mark.parametrize("options", [{"decoder_input": "cls"}, {"target_pool": 8},
                                     {"decoder_input": "cls", "target_pool": 4, "foreground_loss": True}])
def test_options_lower_their_loss(data, options):
    recipe = _mae(**options)
    gen = lambda: torch.Generator().manual_seed(123)
    with torch.no_grad():
        before = float(recipe.loss(data.images, data.labels, 0, gen(), data.foreground))
    fit(recipe, data, LoopConfig(steps=12, batch_size=32, progress=False))
    with torch.no_grad():
        after = float(recipe.loss(data.images, data.labels, 0, gen(), data.foreground))
    assert after < before - 0.02


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="decoder_input"):
        MAEConfig(decoder_input="patches")
    with pytest.raises(ValueError, match="at least 1"):
        MAEConfig(target_pool=0)
    with pytest.raises(ValueError, match="does not divide"):
        _mae(target_pool=3)
    no_cls = _vit()
    no_cls.model.num_prefix_tokens = 0  # a timm-layout ViT without a CLS token (class_token=False)
    with pytest.raises(ValueError, match="CLS token"):
        MAERecipe(no_cls, MAEConfig(decoder_input="cls"))
