"""Every training recipe lowers its loss in a few steps; the loop is seeded, resumable and snapshots."""

import math

import pytest
import torch

from vitscope.models.wrap import build_tiny_resnet, build_tiny_vit
from vitscope.train.data import TensorImages, normalise, synthetic_split
from vitscope.train.loop import LoopConfig, fit
from vitscope.train.mae import MAEConfig, MAERecipe, patchify, random_mask
from vitscope.train.metric import MetricConfig, MetricRecipe, make_metric_loss
from vitscope.train.self_distill import SelfDistillConfig, SelfDistillRecipe, koleo_loss
from vitscope.train.supervised import SupervisedConfig, SupervisedRecipe


@pytest.fixture(scope="module")
def data() -> TensorImages:
    return synthetic_split(64, seed=5, size=32)


def _small_vit(**kw):
    return build_tiny_vit("t", image_size=32, depth=2, embed_dim=32, num_heads=2, **kw)


def _fixed_loss(recipe, data):
    """The recipe's loss on the whole set with fixed augmentations (same generator seed every time)."""
    with torch.no_grad():
        return float(recipe.loss(data.images, data.labels, 0, torch.Generator().manual_seed(123)))


def _trains(recipe, data, steps=12, batch=32):
    before = _fixed_loss(recipe, data)
    fit(recipe, data, LoopConfig(steps=steps, batch_size=batch, progress=False))
    for m in recipe.modules().values():
        m.train()
    after = _fixed_loss(recipe, data)
    return before, after


def test_supervised_lowers_cross_entropy(data):
    recipe = SupervisedRecipe(_small_vit(num_classes=10), SupervisedConfig(lr=3e-3, warmup=1, crop_scale=(0.9, 1.0)))
    before, after = _trains(recipe, data)
    assert after < before - 0.05


def test_mae_lowers_reconstruction_error(data):
    recipe = MAERecipe(_small_vit(num_classes=0))
    recipe.config = type(recipe.config)(lr=3e-3, warmup=1, decoder_dim=32)
    recipe = MAERecipe(_small_vit(num_classes=0), recipe.config)
    before, after = _trains(recipe, data)
    assert after < before - 0.02


def _dino_config(**kw):
    return SelfDistillConfig(out_dim=64, hidden_dim=32, bottleneck_dim=16, local_crops=2, local_size=16, lr=3e-3,
                             warmup=1, **kw)


def test_self_distill_student_learns_to_match_its_teacher(data):
    # A frozen teacher and centre (momentum 1) make the loss a plain function of the student: it must fall.
    recipe = SelfDistillRecipe(_small_vit(num_classes=0), _dino_config(momentum=1.0, center_momentum=1.0))
    before, after = _trains(recipe, data)
    assert after < before - 0.01


def test_self_distill_moves_the_teacher_it_returns(data):
    backbone = _small_vit(num_classes=0)
    recipe = SelfDistillRecipe(backbone, _dino_config(momentum=0.9))
    teacher_before = [p.clone() for p in backbone.model.parameters()]
    result = fit(recipe, data, LoopConfig(steps=3, batch_size=32, progress=False))
    assert result.backbone.model is backbone.model  # the teacher is what the recipe returns
    assert any(not torch.equal(a, b) for a, b in zip(teacher_before, backbone.model.parameters()))
    assert not torch.equal(recipe.centre.center, torch.zeros_like(recipe.centre.center))


def test_synthetic_split_carries_foreground_masks_through_subsets(data):
    assert data.foreground is not None and data.foreground.shape == (64, 32, 32)
    assert 0.05 < data.foreground.float().mean() < 0.95  # objects and background in every scene set
    keep = data.labels < 5
    assert torch.equal(data.subset(keep).foreground, data.foreground[keep])
    assert data.relabel_by_instance().foreground is data.foreground
    with pytest.raises(ValueError, match="foreground must be"):
        TensorImages(data.images, data.labels, foreground=data.foreground[:, :8])


def test_background_swap_views_share_objects_not_backgrounds():
    # Image i is the flat grey 30 * (i + 1) with its left half marked as object; colour augmentations off and
    # full-image crops, so each view is the object's grey on one side (flips) and another image's on the other.
    b, size = 6, 32
    grey = torch.arange(1, b + 1) * 30
    images = grey.view(b, 1, 1, 1).expand(b, 3, size, size).to(torch.uint8).contiguous()
    fg = torch.zeros(b, size, size, dtype=torch.bool)
    fg[:, :, : size // 2] = True
    backbone = _small_vit(num_classes=0)
    recipe = SelfDistillRecipe(backbone, _dino_config(
        background_swap=1.0, jitter=(0.0, 0.0, 0.0, 0.0), grayscale=0.0, solarize=0.0, global_scale=(1.0, 1.0)))
    globals_, _ = recipe._views(images, torch.Generator().manual_seed(0), fg)
    mean, std = backbone.spec.mean[0], backbone.spec.std[0]
    edges = (globals_[:, 0, size // 2, [0, -1]] * std + mean) * 255  # [2B, 2]: leftmost and rightmost pixel
    for v in range(2 * b):
        own = float(grey[v % b])
        assert min(abs(edges[v] - own)) < 1.0  # the object kept its pixels
        assert max(abs(edges[v] - own)) > 20.0  # the background came from another image


def test_background_swap_trains_and_needs_masks(data):
    recipe = SelfDistillRecipe(_small_vit(num_classes=0), _dino_config(
        momentum=1.0, center_momentum=1.0, background_swap=1.0))
    assert recipe.needs_foreground
    with pytest.raises(ValueError, match="foreground masks"):
        fit(recipe, TensorImages(data.images, data.labels), LoopConfig(steps=1, batch_size=32, progress=False))
    fit(recipe, data, LoopConfig(steps=2, batch_size=32, progress=False))


def test_local_crops_on_objects_always_show_part_of_an_object():
    # A white 4 x 4 object in the corner of black 32 px images; local crops of 2-4% of the area
    b, size = 32, 32
    images = torch.zeros(b, 3, size, size, dtype=torch.uint8)
    images[:, :, :4, :4] = 255
    fg = images[:, 0] > 0
    backbone = _small_vit(num_classes=0)
    mean, std = backbone.spec.mean[0], backbone.spec.std[0]

    def share_with_object(on_object):
        recipe = SelfDistillRecipe(backbone, _dino_config(
            local_on_object=on_object, local_scale=(0.02, 0.04), jitter=(0.0, 0.0, 0.0, 0.0), grayscale=0.0))
        assert recipe.needs_foreground == (on_object > 0)
        _, locals_ = recipe._views(images, torch.Generator().manual_seed(0), fg if on_object else None)
        white = locals_[:, 0] * std + mean > 0.25  # blur softens the edges only
        return white.flatten(1).any(1).float().mean()

    assert share_with_object(1.0) == 1.0
    assert share_with_object(0.0) < 0.2  # placed uniformly, few crops reach the corner


def _mae(**kw):
    return MAERecipe(_small_vit(num_classes=0), MAEConfig(lr=3e-3, warmup=1, decoder_dim=32, **kw))


def test_mae_foreground_loss_weights_patches_by_their_object_pixels(data):
    recipe = _mae(foreground_loss=True)
    assert recipe.needs_foreground
    gen = lambda: torch.Generator().manual_seed(7)
    with torch.no_grad():
        plain = _mae().loss(data.images, data.labels, 0, gen())
        everywhere = recipe.loss(data.images, data.labels, 0, gen(), torch.ones_like(data.foreground))
        real = recipe.loss(data.images, data.labels, 0, gen(), data.foreground)
    # Same decoder seed and draws: an all-object mask weights every patch 1 and gives MAE's loss back.
    torch.testing.assert_close(everywhere, plain)
    assert abs(float(real) - float(plain)) > 1e-4  # the real masks re-weight the patches
    with pytest.raises(ValueError, match="foreground masks"):
        recipe.loss(data.images, data.labels, 0, gen())


@pytest.mark.parametrize("options", [{"foreground_loss": True}, {"background_swap": 1.0},
                                     {"foreground_loss": True, "background_swap": 1.0}])
def test_mae_mask_options_train_and_are_refused_without_masks(data, options):
    with pytest.raises(ValueError, match="foreground masks"):
        fit(_mae(**options), TensorImages(data.images, data.labels), LoopConfig(steps=1, batch_size=32, progress=False))
    recipe = _mae(**options)
    assert recipe.needs_foreground
    with torch.no_grad():
        before = float(recipe.loss(data.images, data.labels, 0, torch.Generator().manual_seed(123), data.foreground))
    fit(recipe, data, LoopConfig(steps=12, batch_size=32, progress=False))
    with torch.no_grad():
        after = float(recipe.loss(data.images, data.labels, 0, torch.Generator().manual_seed(123), data.foreground))
    assert after < before - 0.02


def test_self_distill_final_momentum_sets_the_last_teacher_update():
    recipe = SelfDistillRecipe(_small_vit(num_classes=0), _dino_config(momentum=0.9, final_momentum=0.5))
    with torch.no_grad():
        for p in recipe.student.parameters():
            p.fill_(1.0)
        for p in recipe.teacher.parameters():
            p.fill_(0.0)
    recipe.after_step(10, 10)  # the cosine ends at final_momentum: teacher = 0.5 * 0 + 0.5 * 1
    assert all(torch.allclose(p, torch.full_like(p, 0.5)) for p in recipe.teacher.parameters())
    recipe.after_step(0, 10)  # and starts at momentum: 0.9 * 0.5 + 0.1 * 1
    assert all(torch.allclose(p, torch.full_like(p, 0.55)) for p in recipe.teacher.parameters())


def test_koleo_loss_is_minus_the_mean_log_nearest_neighbour_distance():
    # three unit vectors on a half circle: every nearest neighbour is sqrt(2) away
    points = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    assert koleo_loss(points * 3.0).item() == pytest.approx(-math.log(math.sqrt(2.0)), abs=1e-6)
    # a pair squeezed together raises it; identical rows stay finite
    squeezed = torch.tensor([[1.0, 0.0], [0.995, 0.0998], [-1.0, 0.0]])
    assert koleo_loss(squeezed) > koleo_loss(points)
    assert torch.isfinite(koleo_loss(torch.ones(4, 3)))
    with pytest.raises(ValueError, match="at least 2"):
        koleo_loss(torch.ones(1, 3))


def test_self_distill_koleo_spreads_the_students_features(data):
    def spread_after(koleo):
        recipe = SelfDistillRecipe(_small_vit(num_classes=0), _dino_config(koleo=koleo))
        fit(recipe, data, LoopConfig(steps=6, batch_size=32, seed=1, progress=False))
        with torch.no_grad():
            images = normalise(data.images[:32].float() / 255.0, recipe.backbone().spec.mean,
                               recipe.backbone().spec.std)
            return koleo_loss(recipe.student.model.forward_features(images)[:, 0]).item()

    assert spread_after(1.0) < spread_after(0.0) - 0.05


def test_self_distill_global_crops_take_their_own_size(data):
    recipe = SelfDistillRecipe(_small_vit(num_classes=0), _dino_config(global_size=24))
    globals_, locals_ = recipe._views(data.images[:4], torch.Generator().manual_seed(0), size=24)
    assert globals_.shape == (8, 3, 24, 24) and locals_.shape == (8, 3, 16, 16)
    assert torch.isfinite(recipe.loss(data.images[:4], data.labels[:4], 0, torch.Generator().manual_seed(0)))


@pytest.mark.parametrize(("until", "sizes"), [(1.0, [24, 24, 24, 24]), (0.5, [24, 24, 32, 32]), (0.0, [32] * 4)])
def test_self_distill_ends_at_full_resolution_after_global_size_until(data, until, sizes):
    recipe = SelfDistillRecipe(_small_vit(num_classes=0), _dino_config(global_size=24, global_size_until=until))
    recipe.total_steps, seen = 4, []
    recipe.teacher.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[-1]))
    for step in range(4):
        recipe.loss(data.images[:4], data.labels[:4], step, torch.Generator().manual_seed(step))
    assert seen == sizes


@pytest.mark.parametrize("until", [-0.1, 1.5])
def test_self_distill_refuses_a_global_size_until_outside_0_1(until):
    with pytest.raises(ValueError, match="global_size_until"):
        SelfDistillConfig(global_size=24, global_size_until=until)


@pytest.mark.parametrize("loss", ["proxy_anchor", "arcface"])
@pytest.mark.parametrize("arch", ["vit", "resnet"])
def test_metric_losses_decrease(data, loss, arch):
    ids = data.relabel_by_instance()
    bb = _small_vit(num_classes=16, global_pool="avg") if arch == "vit" else build_tiny_resnet(
        "r", num_classes=16, image_size=32, widths=(8, 16, 16, 32))
    recipe = MetricRecipe(bb, int(ids.labels.max()) + 1, MetricConfig(loss=loss, lr=0.05, crop_scale=(0.9, 1.0)))
    before, after = _trains(recipe, ids, steps=15)
    assert after < before


def test_unknown_metric_loss_is_named():
    with pytest.raises(ValueError, match="proxy_anchor, arcface"):
        make_metric_loss("triplet", 3, 4)


def test_patchify_matches_patch_embedding_order():
    x = torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).reshape(2, 3, 4, 4)
    p = patchify(x, 2)
    assert p.shape == (2, 4, 12)
    # token 1 is the top-right patch: rows 0-1, columns 2-3; features are (row, col, channel)
    assert torch.equal(p[0, 1].reshape(2, 2, 3).permute(2, 0, 1), x[0, :, 0:2, 2:4])


def test_random_mask_keeps_distinct_patches():
    ids = random_mask(3, 16, 4, torch.Generator().manual_seed(0))
    assert ids.shape == (3, 4) and all(len(set(r.tolist())) == 4 for r in ids)


def test_fit_is_deterministic_and_resumes_exactly(data, tmp_path):
    def run(steps, ckpt=None, snaps=()):
        recipe = SupervisedRecipe(_small_vit(num_classes=10), SupervisedConfig(warmup=1))
        res = fit(recipe, data, LoopConfig(steps=steps, batch_size=16, seed=3, checkpoint_dir=ckpt,
                                           checkpoint_every=2, snapshot_steps=snaps, progress=False))
        return res

    whole = run(6, snaps=(2,))
    again = run(6)
    assert whole.losses == again.losses
    # an interrupted run: the first 4 steps were checkpointed, then the process died
    first = SupervisedRecipe(_small_vit(num_classes=10), SupervisedConfig(warmup=1))
    with pytest.raises(KeyboardInterrupt):
        def interrupt(step, steps, _orig=first.after_step):
            if step == 4:
                raise KeyboardInterrupt
            _orig(step, steps)
        first.after_step = interrupt
        fit(first, data, LoopConfig(steps=6, batch_size=16, seed=3, checkpoint_dir=tmp_path, checkpoint_every=2,
                                    progress=False))
    resumed = run(6, ckpt=tmp_path)
    assert resumed.resumed_from == 4
    assert resumed.losses == whole.losses
    for a, b in zip(resumed.backbone.model.state_dict().values(), whole.backbone.model.state_dict().values()):
        assert torch.equal(a, b)
    assert set(whole.snapshots) == {2}


@pytest.mark.parametrize("change, named", [
    ({"seed": 4}, "loop.seed"), ({"batch_size": 8}, "loop.batch_size"), ({"steps": 2}, "loop.steps"),
    ({"lr": 0.5}, "recipe.config.lr"), ({"num_heads": 4}, "spec.num_heads"), ({"reverse": True}, "data.digest"),
])
def test_checkpoint_of_another_run_is_ignored_and_the_run_starts_over(data, tmp_path, capsys, change, named):
    """A checkpoint was resumed whenever the recipe's name and the step count matched: another seed, batch size,
    learning rate, model or training set continued the old run's weights and returned its losses."""
    def run(ckpt, seed=3, batch_size=16, steps=1, lr=1e-3, num_heads=2, reverse=False):
        backbone = build_tiny_vit("t", image_size=32, depth=2, embed_dim=32, num_heads=num_heads)
        images = data.subset(torch.arange(len(data)).flip(0)) if reverse else data  # same size, another order
        return fit(SupervisedRecipe(backbone, SupervisedConfig(lr=lr, warmup=1)), images, LoopConfig(
            steps=steps, batch_size=batch_size, seed=seed, checkpoint_dir=ckpt, progress=False))

    run(tmp_path)
    capsys.readouterr()
    again = run(tmp_path, **change)
    message = capsys.readouterr().err
    assert again.resumed_from == 0 and again.losses == run(None, **change).losses
    assert "belongs to a different run" in message and "starting over" in message
    assert message.split("changed: ")[1].split(")")[0] == named, message
    if named == "loop.seed":  # the new run's own checkpoint resumes
        assert run(tmp_path, **change).resumed_from == len(again.losses)


def test_too_small_dataset_is_explained(data):
    with pytest.raises(ValueError, match="smaller than one batch"):
        fit(SupervisedRecipe(_small_vit(num_classes=10)), data.subset(torch.arange(4)),
            LoopConfig(steps=1, batch_size=8, progress=False))
