"""Feature visualisation: objectives, augmentations, total variation and the published recipe (paper 001)."""

from __future__ import annotations

import pickle

import pytest
import torch

import vitscope
from vitscope.featviz import (
    AugmentConfig,
    ChannelObjective,
    ClassLogit,
    ConvChannel,
    Direction,
    FeatvizConfig,
    FFNChannel,
    Key,
    Query,
    Value,
    augment,
    evaluate,
    parse_objective,
    render,
)
from vitscope.featviz.augment import max_shift
from vitscope.featviz.render import _stop_block
from vitscope.functional import total_variation

PLAIN = AugmentConfig(copies=1, jitter=0, color_shift="none", noise="none")


@pytest.fixture(scope="module")
def tiny():
    return vitscope.load_model("tiny-vit-sup")


def test_total_variation_matches_hand_computation() -> None:
    x = torch.tensor([[[[0.0, 1.0], [3.0, 5.0]]]])  # [1, 1, 2, 2]
    # horizontal (1, 2) -> sqrt(5); vertical (3, 4) -> 5; diagonal (5) -> 5; anti-diagonal (3 - 1 = 2) -> 2
    want = 5 ** 0.5 + 5 + 5 + 2
    assert total_variation(x).item() == pytest.approx(want, rel=1e-6)
    two = torch.cat([x, 2 * x])
    assert total_variation(two, reduction="none").tolist() == pytest.approx([want, 2 * want], rel=1e-6)
    assert total_variation(two).item() == pytest.approx(1.5 * want, rel=1e-6)
    flat = torch.ones(1, 3, 4, 4, requires_grad=True)
    total_variation(flat).backward()
    assert torch.isfinite(flat.grad).all()
    with pytest.raises(ValueError, match="B, C, H, W"):
        total_variation(torch.ones(3, 4, 4))


def test_objectives_compose_with_readable_names_and_pickle() -> None:
    a, b = FFNChannel(5, 31), Key(2, 4)
    assert a.name == "blocks.5.mlp.post:31"
    assert (a + 0.5 * b).name == "blocks.5.mlp.post:31 + 0.5*blocks.2.attn.k:4"
    assert (a - b).name == "blocks.5.mlp.post:31 - blocks.2.attn.k:4"
    assert (-a).name == "-blocks.5.mlp.post:31"
    assert (a * 2).name == "2*blocks.5.mlp.post:31"
    combo = 2 * a - 0.5 * Direction("blocks.1.resid_post", torch.ones(4), label="ones") + ClassLogit(3)
    assert set(combo.hooks()) == {"blocks.5.mlp.post", "blocks.1.resid_post"}
    assert combo.needs_logits
    clone = pickle.loads(pickle.dumps(combo))
    assert clone == combo and clone.name == combo.name
    with pytest.raises(TypeError):
        _ = a * "2"


def test_combination_is_the_weighted_sum_of_its_terms(tiny) -> None:
    spec = tiny.spec
    gen = torch.Generator().manual_seed(0)
    acts = {"blocks.1.mlp.post": torch.randn(3, spec.num_tokens, spec.mlp_dim, generator=gen),
            "blocks.0.attn.q": torch.randn(3, spec.num_heads, spec.num_tokens, 32, generator=gen),
            "logits": torch.randn(3, 10, generator=gen)}
    a, q, lg = FFNChannel(1, 7), Query(0, 33), ClassLogit(4)
    got = (a - 2 * q + 0.25 * lg)(acts, spec, spec.grid)
    want = a(acts, spec, spec.grid) - 2 * q(acts, spec, spec.grid) + 0.25 * lg(acts, spec, spec.grid)
    torch.testing.assert_close(got, want)
    # the channel objective is the spatial mean; the attention channel indexes the concatenated heads
    torch.testing.assert_close(a(acts, spec, spec.grid), acts["blocks.1.mlp.post"][:, 1:, 7].mean(1))
    torch.testing.assert_close(q(acts, spec, spec.grid), acts["blocks.0.attn.q"][:, 1, 1:, 1].mean(1))
    at = FFNChannel(1, 7, token=(2, 3))(acts, spec, spec.grid)
    torch.testing.assert_close(at, acts["blocks.1.mlp.post"][:, 1 + 2 * 8 + 3, 7])
    with pytest.raises(ValueError, match="out of range"):
        FFNChannel(1, 9999)(acts, spec, spec.grid)


def test_a_direction_on_an_attention_site_lives_in_the_concatenated_heads(tiny) -> None:
    """On [B, H, N, Dh] the direction took H entries and mixed heads over every token (CLS included) and every
    Dh position; a direction of the H * Dh channels ChannelObjective uses was refused."""
    spec = tiny.spec
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(3, spec.num_heads, spec.num_tokens, 32, generator=gen)  # [B, H, N, Dh]
    acts = {"blocks.2.attn.k": k}
    for channel in (0, 37, 127):  # a one-hot direction is that channel (head channel // 32, dim channel % 32)
        one_hot = torch.zeros(spec.num_heads * 32)
        one_hot[channel] = 2.0
        torch.testing.assert_close(Direction("blocks.2.attn.k", one_hot)(acts, spec, spec.grid),
                                   Key(2, channel)(acts, spec, spec.grid))
    v = torch.randn(spec.num_heads * 32, generator=gen)
    concatenated = k[:, :, 1:].permute(0, 2, 1, 3).reshape(3, spec.num_tokens - 1, -1)  # [B, K, H * Dh], CLS dropped
    want = concatenated @ (v / v.norm())
    torch.testing.assert_close(Direction("blocks.2.attn.k", v)(acts, spec, spec.grid), want.mean(1))
    torch.testing.assert_close(Direction("blocks.2.attn.k", v, token=(1, 2))(acts, spec, spec.grid), want[:, 10])
    with pytest.raises(ValueError, match="4 entries, the site 128 channels"):
        Direction("blocks.2.attn.k", torch.ones(spec.num_heads))(acts, spec, spec.grid)


def test_parse_objective() -> None:
    assert parse_objective("blocks.5.mlp.post:31") == FFNChannel(5, 31)
    assert parse_objective("blocks.5.mlp.post:31@2,3") == FFNChannel(5, 31, token=(2, 3))
    assert parse_objective("blocks.5.mlp.post:31@12").token == 12
    assert parse_objective("stages.2:7") == ConvChannel(2, 7)
    assert parse_objective("logit:3") == ClassLogit(3)
    for bad in ("blocks.5.mlp.post", "logit:x", "blocks.5:mlp:3", ""):
        with pytest.raises(ValueError, match="SITE:CHANNEL"):
            parse_objective(bad)


def test_forward_stops_after_the_deepest_block_read() -> None:
    assert _stop_block(["blocks.1.mlp.post", "blocks.3.attn.k"], False, 6) == (4, False)
    assert _stop_block(["stages.2"], False, 4) == (3, False)
    assert _stop_block(["blocks.1.mlp.post", "final_norm"], False, 6) == (6, True)
    assert _stop_block([], True, 6) == (6, True)
    assert _stop_block(["embed"], False, 6) == (1, False)  # adapters record it as block 0's input


def test_augment_follows_the_published_recipe() -> None:
    assert max_shift(32, (224, 224)) == (32, 32) and max_shift(32, (64, 128)) == (9, 18)
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    out = augment(x, 0, 10, torch.Generator().manual_seed(1), AugmentConfig(color_shift="none", noise="none"))
    assert out.shape == (16, 3, 64, 64)
    # one shared roll: every copy of a unit is the same image, and a roll of the original
    assert torch.equal(out[0], out[7]) and not torch.equal(out[0], out[8])
    shifts = [(dy, dx) for dy in range(-9, 10) for dx in range(-9, 10)]
    assert any(torch.equal(out[0], torch.roll(x[0], s, (-2, -1))) for s in shifts)
    # channel noise: a constant per image and channel, annealed to zero at the end
    noisy = augment(x, 0, 10, torch.Generator().manual_seed(1), AugmentConfig(jitter=0, color_shift="none"))
    diff = noisy - x.repeat_interleave(8, 0)
    assert torch.allclose(diff, diff.mean(dim=(-2, -1), keepdim=True), atol=1e-6) and diff.abs().max() > 0
    late = augment(x, 10, 10, torch.Generator().manual_seed(1), AugmentConfig(jitter=0, color_shift="none"))
    assert torch.equal(late, x.repeat_interleave(8, 0))
    pixel = augment(x, 0, 10, torch.Generator().manual_seed(1),
                    AugmentConfig(jitter=0, color_shift="none", noise="pixel")) - x.repeat_interleave(8, 0)
    assert pixel.std(dim=(-2, -1)).min() > 0.3
    # ColorShift (x - mu) / sigma with mu in (-1, 1), sigma in (1/e, e): affine per image and channel
    cs = augment(x, 0, 10, torch.Generator().manual_seed(1), AugmentConfig(jitter=0, noise="none"))
    base = x.repeat_interleave(8, 0)
    scale = (cs[..., 0, 1] - cs[..., 0, 0]) / (base[..., 0, 1] - base[..., 0, 0])
    assert ((1 / scale) > 1 / torch.e - 1e-4).all() and ((1 / scale) < torch.e + 1e-4).all()
    with pytest.raises(ValueError, match="noise"):
        AugmentConfig(noise="gaussian")


def test_noise_falls_linearly_to_zero_at_the_last_step() -> None:
    """The std was noise_std * (1 - step / steps): noise_std / steps at the last step (0.125 of 4 steps), not 0."""
    x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    cfg = AugmentConfig(copies=3, jitter=0, color_shift="none", noise_std=0.5)
    for step, factor in enumerate([1.0, 2 / 3, 1 / 3, 0.0]):
        gen = torch.Generator().manual_seed(7)
        got = augment(x, step, 4, gen, cfg) - x.repeat_interleave(3, 0)
        replay = torch.Generator().manual_seed(7)  # the same draws: the two (empty) shifts, then the noise
        torch.randint(0, 1, (1, 1), generator=replay), torch.randint(0, 1, (1, 1), generator=replay)
        want = torch.randn(6, 3, 1, 1, generator=replay) * 0.5 * factor
        torch.testing.assert_close(got, want.expand_as(got), rtol=0, atol=1e-6)
    assert augment(x, 0, 1, torch.Generator().manual_seed(7), cfg).sub(x.repeat_interleave(3, 0)).abs().max() > 0


def test_every_objective_loss_falls_within_5_steps(tiny) -> None:
    direction = torch.randn(128, generator=torch.Generator().manual_seed(0))
    objectives = [FFNChannel(3, 7), FFNChannel(3, 7, token=(2, 3)), Key(2, 5), Query(1, 3), Value(4, 9),
                  ClassLogit(2), Direction("blocks.2.resid_post", direction), FFNChannel(5, 1) - 0.5 * FFNChannel(5, 2)]
    res = render(tiny, objectives, FeatvizConfig(steps=5, augment=PLAIN))
    assert res.loss.shape == (5, len(objectives)) and res.images.shape == (8, 3, 64, 64)
    falls = res.loss[-1] < res.loss[0]
    assert falls.all(), [o.name for o, f in zip(objectives, falls) if not f]
    assert res.images.min() >= 0 and res.images.max() <= 1


def test_cnn_channel_loss_falls_within_5_steps() -> None:
    cnn = vitscope.load_model("tiny-resnet-metric")
    res = render(cnn, [ConvChannel(1, 3), ConvChannel(2, 5, token=(1, 1))], FeatvizConfig(steps=5, augment=PLAIN))
    assert (res.loss[-1] < res.loss[0]).all()


def test_hf_classifier_objectives() -> None:
    from helpers.hf_factories import make

    hf = vitscope.wrap(make("vit-cls"))
    res = render(hf, [FFNChannel(1, 3), ClassLogit(1)], FeatvizConfig(steps=5, augment=PLAIN))
    assert (res.loss[-1] < res.loss[0]).all()


def test_weights_frozen_during_the_run_and_restored(tiny) -> None:
    params = list(tiny.parameters())
    params[0].requires_grad_(False)
    tiny.model.train()
    norms = [m for m in tiny.model.modules() if isinstance(m, torch.nn.LayerNorm)]
    for norm in norms:  # frozen norms of a model being fine-tuned: the whole model came back in training mode
        norm.eval()
    seen = []

    def callback(info) -> None:
        seen.append((info.step, any(p.requires_grad for p in params), tiny.model.training,
                     all(p.grad is None for p in params)))

    try:
        render(tiny, FFNChannel(0, 1), FeatvizConfig(steps=3, augment=AugmentConfig(copies=2)), callback=callback)
        assert [s[0] for s in seen] == [0, 1, 2]
        assert not any(s[1] or s[2] for s in seen) and all(s[3] for s in seen)
        assert not params[0].requires_grad and all(p.requires_grad for p in params[1:])
        assert tiny.model.training and norms and not any(norm.training for norm in norms)
    finally:
        params[0].requires_grad_(True)
        tiny.model.eval()


def test_same_seed_same_images(tiny) -> None:
    cfg = FeatvizConfig(steps=2, seed=3, augment=AugmentConfig(copies=2))
    a, b = render(tiny, FFNChannel(1, 2), cfg), render(tiny, FFNChannel(1, 2), cfg)
    assert torch.equal(a.images, b.images)
    c = render(tiny, FFNChannel(1, 2), FeatvizConfig(steps=2, seed=4, augment=AugmentConfig(copies=2)))
    assert not torch.equal(a.images, c.images)


def test_a_unit_renders_alike_alone_and_beside_others(tiny) -> None:
    """One generator for the whole batch gave a unit another image (and activation 0.29 for 0.24) when another
    unit joined the run."""
    cfg = FeatvizConfig(steps=3, seed=3, augment=AugmentConfig(copies=2))
    alone = render(tiny, FFNChannel(1, 2), cfg)
    together = render(tiny, [FFNChannel(0, 5), FFNChannel(1, 2), FFNChannel(1, 7)], cfg)
    torch.testing.assert_close(together.images[1:2], alone.images, rtol=0, atol=1e-6)
    torch.testing.assert_close(together.activation[:, 1:2], alone.activation, rtol=1e-6, atol=1e-6)


def test_optimised_image_beats_the_best_of_500_synthetic_images(tiny) -> None:
    from vitscope.train.data import synthetic_split

    unit = FFNChannel(1, 5)
    best = float(evaluate(tiny, unit, synthetic_split(500, seed=1, size=64).images).max())
    res = render(tiny, unit, FeatvizConfig(steps=60))  # the published recipe, fewer steps
    got = float(evaluate(tiny, unit, res.images)[0])
    assert got > best, (got, best)


def test_logit_objective_needs_a_head() -> None:
    backbone = vitscope.load_model("tiny-vit-mae")
    with pytest.raises(ValueError, match="no classifier head"):
        render(backbone, ClassLogit(0), FeatvizConfig(steps=1))
    with pytest.raises(TypeError, match="Objective"):
        render(backbone, [], FeatvizConfig(steps=1))


def test_channel_objective_on_any_site_reads_the_record(tiny) -> None:
    obj = ChannelObjective("blocks.2.resid_post", 4)
    images = torch.rand(3, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    x = (images - torch.tensor(tiny.spec.mean).view(1, 3, 1, 1)) / torch.tensor(tiny.spec.std).view(1, 3, 1, 1)
    with torch.no_grad(), tiny.record(["blocks.2.resid_post"]) as rec:
        tiny(x)
        want = rec["blocks.2.resid_post"][:, 1:, 4].mean(1).double()
    torch.testing.assert_close(evaluate(tiny, obj, images), want, rtol=1e-5, atol=1e-6)


def test_objectives_on_the_final_norm_read_the_normed_tokens(tiny) -> None:
    """The truncated forward read the record before running the final norm, so no final_norm objective ran."""
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    x = (images - torch.tensor(tiny.spec.mean).view(1, 3, 1, 1)) / torch.tensor(tiny.spec.std).view(1, 3, 1, 1)
    with torch.no_grad(), tiny.record(["final_norm"]) as rec:
        tiny(x)
        normed = rec["final_norm"][:, 1:].double()  # [B, K, D], prefix dropped
    vector = torch.randn(tiny.spec.embed_dim, generator=torch.Generator().manual_seed(1))
    objs = [parse_objective("final_norm:3"), Direction("final_norm", vector, label="latent")]
    got = evaluate(tiny, objs, images)
    want = torch.stack([normed[..., 3].mean(1), (normed @ (vector / vector.norm()).double()).mean(1)], dim=1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    res = render(tiny, objs, FeatvizConfig(steps=2, augment=PLAIN))
    assert torch.isfinite(res.activation).all()


def test_a_repeated_unit_is_optimised_once(tiny, tmp_path) -> None:
    """A unit given twice, or given and drawn by --grid, was optimised twice; then the writer refused the two
    figures of one name and the whole optimisation was lost."""
    from vitscope.featviz.workflow import FeatvizOptions, featviz_run, grid_units

    drawn = [u.name for u in grid_units(tiny, 1, seed=0)]
    units = ["blocks.1.mlp.post:3", drawn[2], "blocks.1.mlp.post:3"]
    said: list[str] = []
    run = featviz_run(FeatvizOptions(model="tiny-vit-sup", out=tmp_path, units=units, grid=1, seed=0, steps=1,
                                     image_size=32), log=said.append)
    want = ["blocks.1.mlp.post:3", drawn[2]] + [u for u in drawn if u != drawn[2]]
    assert run.config["units"] == want and list(run.results["featviz"].meta["units"]) == want
    stems = [f.stem for f in run.results["featviz"].figures()]
    assert len(stems) == len(set(stems)) == 1 + len(want)  # the grid and one image per unit
    assert any(line.startswith(f"blocks.1.mlp.post:3, {drawn[2]}: given more than once") for line in said), said


def test_a_unit_below_its_best_dataset_image_is_a_warning_and_a_note() -> None:
    from vitscope.featviz.workflow import WeakFeatureVisualisationWarning, _weak_units

    units = {"blocks.4.mlp.post:7": {"activation": -0.036, "best_dataset_score": 0.489, "below_dataset_best": True},
             "blocks.2.mlp.post:3": {"activation": 1.4, "best_dataset_score": 0.54, "below_dataset_best": False},
             "blocks.1.mlp.post:0": {"activation": 0.3}}  # no --data: nothing to compare with
    with pytest.warns(WeakFeatureVisualisationWarning) as caught:
        notes = _weak_units(units)
    assert len(caught) == 1 and len(notes) == 1
    assert notes[0].startswith("blocks.4.mlp.post:7: the optimised image reaches -0.036, below the best dataset "
                               "image (0.489)")


def test_the_report_states_the_recipe_the_run_used(tiny, tmp_path) -> None:
    """The section's intro claimed the published recipe (ColorShift, noise, the spatial mean) whatever the run used."""
    from vitscope.featviz.workflow import FeatvizOptions, featviz_run

    def intro(**changes) -> str:
        opts = dict(model="tiny-vit-sup", out=tmp_path, units=["blocks.1.mlp.post:3@2,3"], steps=1, image_size=32)
        run = featviz_run(FeatvizOptions(**{**opts, **changes}))
        assert run.results["featviz"].meta["recipe"]["augment"]["noise"] == changes.get("noise", "channel")
        return next(s for s in run.sections if s.id == "featviz").intro

    published, plain = intro(seed=3), intro(noise="none", color_shift="none", lambda_tv=0.0)
    assert "the published recipe of paper 001: 8 augmented copies" in published
    assert "ColorShift (code form)" in published
    assert "1 step of Adam (lr 0.1, cosine schedule)" in published and "at one token" in published
    assert "recipe changed (ColorShift, noise, total variation off)" in plain
    assert "ColorShift (" not in plain and "noise annealed" not in plain and "total variation (" not in plain
