"""MAE's experimental options: a CLS-only decoder input and pooled targets (docs/zoo-findings.md, session 11)."""

import dataclasses

import pytest
import torch

from vitscope.models.backbone import Backbone
from vitscope.models.wrap import build_tiny_vit
from vitscope.train.data import TensorImages, synthetic_split
from vitscope.train.loop import LoopConfig, fit
from vitscope.train.mae import MAEConfig, MAEDecoder, MAERecipe, patchify, pooled_patches, random_mask


@pytest.fixture(scope="module")
def data() -> TensorImages:
    return synthetic_split(64, seed=5, size=32)


def _vit(**kw) -> Backbone:
    return build_tiny_vit("t", image_size=32, depth=2, embed_dim=32, num_heads=2, num_classes=0, **kw)


def _mae(vit: Backbone | None = None, mask_fn=random_mask, **kw) -> MAERecipe:
    return MAERecipe(vit or _vit(), MAEConfig(lr=3e-3, warmup=1, decoder_dim=32, **kw), mask_fn)


def test_pooled_patches_by_hand():
    images = torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).reshape(2, 3, 4, 4)
    torch.testing.assert_close(pooled_patches(images, 2, 1), patchify(images, 2))
    means = pooled_patches(images, 2, 2)  # [2, 4 patches, 3 channels]: each patch's mean colour
    assert means.shape == (2, 4, 3)
    assert means[0, 1, 0] == pytest.approx(4.5)  # top-right patch, channel 0: pixels 2, 3, 6, 7
    assert means[1, 3, 2] == pytest.approx(92.5)  # bottom-right patch of image 1, channel 2: 90, 91, 94, 95
    # Inside a token the cells run row by row, as patchify's pixels: top-right 4 px patch of an 8 x 8 ramp.
    ramp = torch.arange(64, dtype=torch.float32).reshape(1, 1, 8, 8)
    assert pooled_patches(ramp, 4, 2)[0, 1].tolist() == [8.5, 10.5, 24.5, 26.5]
    with pytest.raises(ValueError, match="does not divide"):
        pooled_patches(ramp, 4, 3)


def test_decoder_predicts_the_pooled_patch_size():
    assert _mae(target_pool=2).decoder.pred.out_features == (8 // 2) ** 2 * 3  # build_tiny_vit: patch 8 at 32 px
    assert _mae().decoder.pred.out_features == 8 * 8 * 3


def test_decoder_without_visible_tokens_reads_the_prefix_and_the_positions():
    decoder = MAEDecoder(16, (2, 2), 4, 16, 1, 2).eval()
    cls = torch.randn(2, 1, 16)
    none = torch.zeros(2, 0, dtype=torch.long)
    with torch.no_grad():
        out, shifted = decoder(cls, none, 4, 1), decoder(cls + 1.0, none, 4, 1)
    assert out.shape == (2, 4, 4 * 4 * 3)
    assert not torch.allclose(out[:, 0], out[:, 1])  # each position is told apart by its embedding
    assert not torch.allclose(out, shifted)  # and what it predicts comes from the CLS


@pytest.mark.parametrize("decoder_input, registers, seen", [("tokens", 0, 1 + 4), ("cls", 0, 1), ("cls", 2, 1)])
def test_cls_input_hands_the_decoder_the_cls_token_only(data, decoder_input, registers, seen):
    recipe = _mae(_vit(num_reg_tokens=registers), decoder_input=decoder_input)  # 16 patches, 4 visible
    shapes = []
    recipe.decoder.register_forward_pre_hook(lambda mod, args: shapes.append((args[0].shape[1], args[1].shape[1])))
    with torch.no_grad():
        recipe.loss(data.images[:4], data.labels[:4], 0, torch.Generator().manual_seed(0))
    assert shapes == [(seen, seen - 1)]


def test_cls_input_still_scores_the_masked_patches_only(data):
    kept = []
    recipe = _mae(mask_fn=lambda *a: kept.append(random_mask(*a)) or kept[-1], decoder_input="cls")
    images, labels = data.images[:4], data.labels[:4]

    def loss_with(offset_at_visible: bool) -> float:
        def shift(module, args, out):
            ids = kept[-1] if offset_at_visible else (kept[-1] + 1) % out.shape[1]
            return out.scatter_add(1, ids.unsqueeze(-1).expand(-1, -1, out.shape[-1]), torch.full_like(out, 100.0))

        handle = recipe.decoder.register_forward_hook(shift)
        with torch.no_grad():
            value = float(recipe.loss(images, labels, 0, torch.Generator().manual_seed(0)))
        handle.remove()
        return value

    with torch.no_grad():
        plain = float(recipe.loss(images, labels, 0, torch.Generator().manual_seed(0)))
    assert loss_with(offset_at_visible=True) == pytest.approx(plain)  # visible patches are not scored
    assert loss_with(offset_at_visible=False) > plain + 1.0  # (some of) the masked ones are


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
    no_cls.spec = dataclasses.replace(no_cls.spec, num_prefix_tokens=0, prefix_kinds=())  # e.g. class_token=False
    with pytest.raises(ValueError, match="CLS token"):
        MAERecipe(no_cls, MAEConfig(decoder_input="cls"))
