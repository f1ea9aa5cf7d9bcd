"""Guided masking plugged into the MAE recipe: masks follow keypoints and the rho curriculum; training runs."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("cv2")

from vitscope.experiments.guided_mae import GuidedMAEConfig, convergence_summary
from vitscope.models.wrap import build_tiny_vit
from vitscope.train import LoopConfig, MAEConfig, fit, synthetic_split
from vitscope.train.data import normalise
from vitscope.train.guided_masking import GuidedMAERecipe, GuidedMaskFn, pixels_keypoint_counts


@pytest.fixture(scope="module")
def data():
    return synthetic_split(16, seed=2, size=32)


def _recipe(levels=(0.0, 1.0)):
    backbone = build_tiny_vit("mae", num_classes=0, image_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=2)
    return GuidedMAERecipe(backbone, MAEConfig(mask_ratio=0.5, decoder_dim=16, decoder_depth=1, decoder_heads=2),
                           steps_per_epoch=2, every_epochs=1, levels=levels)


@pytest.mark.parametrize(("step", "rho"), [(0, 0.0), (2, 1.0)])
def test_masks_follow_keypoints_and_the_curriculum(data, step: int, rho: float) -> None:
    recipe = _recipe()
    assert recipe.rho_at(step) == rho
    spec = recipe.backbone().spec
    pixels = normalise(data.images[:6], spec.mean, spec.std)
    recipe._step = step
    with torch.no_grad():
        _, ids_keep = recipe.encode_visible(pixels, torch.Generator().manual_seed(0))
    counts = pixels_keypoint_counts(pixels, spec.mean, spec.std, spec.grid).flatten(1)
    assert ids_keep.shape == (6, 8)  # 16 patches, half masked
    for keep, c in zip(ids_keep, counts):
        masked = torch.ones(16, dtype=torch.bool)
        masked[keep] = False
        key = int((c > 0).sum())
        want = max(0, 8 - (16 - key)) if rho == 0 else min(8, key)  # spill-over when a group is too small
        assert int((masked & (c > 0)).sum()) == want


def test_mask_fn_needs_counts_and_training_runs(data) -> None:
    with pytest.raises(RuntimeError, match="keypoint counts"):
        GuidedMaskFn()(2, 16, 8, torch.Generator())
    result = fit(_recipe(), data, LoopConfig(steps=3, batch_size=8, seed=0, progress=False))
    assert len(result.losses) == 3 and all(torch.isfinite(torch.tensor(result.losses)))


def test_eval_steps_and_convergence_summary() -> None:
    cfg = GuidedMAEConfig(steps=10, eval_points=3, train_images=64, batch_size=16)
    assert cfg.eval_steps() == [0, 3, 7, 10] and cfg.steps_per_epoch == 4
    s = convergence_summary([0, 5, 10], {"random": [0.1, 0.5, 0.8], "guided": [0.1, 0.78, 0.8]})
    assert s["faster"] == "guided" and s["first_step"] == {"random": 10, "guided": 5}
    assert convergence_summary([0, 5], {"a": [0.1, 0.9], "b": [0.1, 0.9]})["faster"] == "tie"
    with pytest.raises(ValueError, match="at least one batch"):
        GuidedMAEConfig(train_images=8, batch_size=16)


def test_twins_train_on_the_same_crops(data, monkeypatch, one_thread) -> None:
    # the guided mask draws two permutations per image, the random one a row of noise: with one generator for
    # crops and masks the twins' crops would part from the second step on
    import vitscope.train.mae as mae_module
    from vitscope.experiments.guided_mae import _model, _twin_recipe

    crop, seen = mae_module.random_resized_crop, []
    monkeypatch.setattr(mae_module, "random_resized_crop", lambda *a, **k: seen.append(crop(*a, **k)) or seen[-1])
    cfg = GuidedMAEConfig(steps=3, batch_size=8, train_images=16, image_size=32, embed_dim=16, depth=1, num_heads=2)
    for twin in ("random", "guided"):
        fit(_twin_recipe(twin, _model(cfg)[1], cfg), data, LoopConfig(steps=3, batch_size=8, seed=0, progress=False))
    assert len(seen) == 6 and all(torch.equal(a, b) for a, b in zip(seen[:3], seen[3:], strict=True))


def test_own_mask_generator_is_seeded_by_step() -> None:
    shared = torch.Generator()
    assert _recipe().mask_generator(5, shared) is shared  # MAE's default: the loop's generator
    own = GuidedMAERecipe(_recipe().backbone(), MAEConfig(mask_seed=-1)).mask_generator(5, shared)
    assert own.initial_seed() == (-1_000_003 + 5) % 2**64  # any integer: taken modulo 2**64
    big = GuidedMAERecipe(_recipe().backbone(), MAEConfig(mask_seed=2**70)).mask_generator(0, shared)
    assert big.initial_seed() == 2**70 * 1_000_003 % 2**64


def test_rho_staircase_draws_every_level_where_it_starts(tmp_path, monkeypatch) -> None:
    from vitscope.experiments.guided_mae import rho_staircase
    from vitscope.viz import masking_figures

    # 2 steps per epoch, a level every epoch: rho 0 for steps 0-1, 0.5 for 2-3, 1 from step 4
    epochs, rho = rho_staircase(_recipe(levels=(0.0, 0.5, 1.0)), 7)
    assert epochs == [0.0, 1.0, 1.0, 2.0, 2.0, 3.5] and rho == [0.0, 0.0, 0.5, 0.5, 1.0, 1.0]
    assert rho_staircase(_recipe(levels=(0.0, 0.5, 1.0)), 2) == ([0.0, 1.0], [0.0, 0.0])
    drawn = []
    monkeypatch.setattr(masking_figures, "save_figure", lambda fig, stem: drawn.append(fig) or [])
    masking_figures.guided_mae_figure([0.0, 3.5], {"random": [0.1, 0.2]}, "acc", tmp_path / "f", (epochs, rho))
    line = drawn[0].axes[1].lines[0]  # the twin axis: rho
    assert list(line.get_xdata()) == epochs and list(line.get_ydata()) == rho


def test_twins_that_never_score_are_neither_and_a_width_must_split_into_heads() -> None:
    """Accuracy 0 everywhere was a tie at step 0 ("first to 0.000"); --embed-dim 10 over 4 heads crashed in a
    reshape, reported as a bug in vitscope."""
    from vitscope.errors import VitscopeValueError

    never = convergence_summary([0, 5], {"random": [0.0, 0.0], "guided": [0.0, 0.0]})
    assert never["faster"] == "neither" and never["first_step"] == {"random": None, "guided": None}
    with pytest.raises(VitscopeValueError, match=r"embed_dim \(10\) must be a multiple of num_heads \(4\)"):
        GuidedMAEConfig(embed_dim=10)


@pytest.mark.parametrize("ratio", [0.0, 1.0, -0.5])
def test_a_mask_ratio_that_hides_nothing_or_everything_is_refused(ratio: float) -> None:
    """Ratio 0 hid no patch: the loss over hidden patches was 0 at every step and the twins learned nothing."""
    from vitscope.errors import VitscopeValueError

    with pytest.raises(VitscopeValueError, match=r"mask_ratio must be in \(0, 1\)"):
        MAEConfig(mask_ratio=ratio)
    with pytest.raises(VitscopeValueError, match=r"mask_ratio must be in \(0, 1\)"):
        GuidedMAEConfig(mask_ratio=ratio)


def test_a_ratio_that_rounds_to_no_hidden_patch_still_hides_one(data) -> None:
    from vitscope.train.mae import MAERecipe

    backbone = build_tiny_vit("mae", num_classes=0, image_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=2)
    recipe = MAERecipe(backbone, MAEConfig(mask_ratio=0.01, decoder_dim=16, decoder_depth=1, decoder_heads=2))
    spec = backbone.spec
    with torch.no_grad():
        _, ids_keep = recipe.encode_visible(normalise(data.images[:2], spec.mean, spec.std),
                                            torch.Generator().manual_seed(0))
        loss = recipe.loss(data.images[:2], data.labels[:2], 0, torch.Generator().manual_seed(0))
    assert ids_keep.shape == (2, 15)  # 16 patches: 0.01 rounds to none hidden; one is
    assert loss.item() > 0
