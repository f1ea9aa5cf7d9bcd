"""The ready-made interventions (:mod:`vitscope.interventions`) against their definitions, by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import vitscope
from vitscope.errors import VitscopeValueError
from vitscope.hooks.edits import running_images
from vitscope.interventions import ablate_heads, ablate_tokens, patch, reference_means, steer

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    return vitscope.load_model("tiny-vit-sup")


def pixels(b, n=4, seed=0) -> torch.Tensor:
    return torch.randn(n, 3, *b.spec.image_size, generator=torch.Generator().manual_seed(seed))


def recorded(b, x, names, edits=None):
    with torch.no_grad(), b.intervene(edits or {}), b.record(names) as rec:
        out = b(x)
    return {k: v.clone() for k, v in rec.items()}, out


def test_heads_are_replaced_by_their_controls_and_the_others_kept(model):
    x, reference = pixels(model), pixels(model, n=6, seed=1)
    name = "blocks.2.attn.heads"
    means = reference_means(model, reference, name, batch_size=4)
    by_hand = recorded(model, reference, name)[0][name].mean(dim=0)
    torch.testing.assert_close(means[name], by_hand, atol=1e-6, rtol=1e-6)
    clean = recorded(model, x, name)[0][name]
    for mode, expected in (("zero", torch.zeros_like(clean[:, 1])),
                           ("mean", means[name][1].expand_as(clean[:, 1])),
                           ("resample", clean.roll(-1, 0)[:, 1])):
        edited = recorded(model, x, name, ablate_heads({2: [1]}, mode=mode, reference=means))[0][name]
        torch.testing.assert_close(edited[:, 1], expected, msg=mode)
        torch.testing.assert_close(edited[:, [0, 2]], clean[:, [0, 2]], msg=mode)  # the other heads untouched
    others = recorded(model, pixels(model, n=4, seed=9), name)[0]  # resampled from other images' recording
    edited = recorded(model, x, name, ablate_heads({2: [1]}, mode="resample", reference=others))[0][name]
    torch.testing.assert_close(edited[:, 1], others[name][:, 1])
    with pytest.raises(VitscopeValueError, match="needs reference"):
        ablate_heads({2: [1]}, mode="mean")
    with pytest.raises(VitscopeValueError, match=f"do not exist: the block has {model.spec.num_heads} heads"):
        recorded(model, x, name, ablate_heads({2: [7]}))


def test_tokens_are_replaced_where_asked(model):
    x = pixels(model)
    clean = recorded(model, x, "embed")[0]["embed"]
    zeroed = recorded(model, x, "embed", ablate_tokens([1, 5]))[0]["embed"]
    assert float(zeroed[:, [1, 5]].abs().max()) == 0.0 and torch.equal(zeroed[:, 2], clean[:, 2])
    mask = torch.zeros(x.shape[0], clean.shape[1], dtype=torch.bool)
    mask[0, 3] = True
    one = recorded(model, x, "embed", ablate_tokens(mask, mode="resample"))[0]["embed"]
    assert torch.equal(one[0, 3], clean[1, 3]) and torch.equal(one[1:], clean[1:])
    noisy = [recorded(model, x, "embed", ablate_tokens([1], mode="noise", seed=3))[0]["embed"] for _ in range(2)]
    assert torch.equal(noisy[0], noisy[1]) and not torch.equal(noisy[0][:, 1], clean[:, 1])


def test_noise_takes_its_scale_from_the_reference_whatever_the_batch(model):
    """Per token position and channel, the standard deviation of the reference images: the same scale for a
    batch of one as for sixteen (a batch of one used |x|, five times the spread of the data)."""
    reference = recorded(model, pixels(model, seed=7, n=32), "embed")[0]
    target = reference["embed"].std(dim=0)[1]  # [D]: token 1's spread over the reference
    for n in (1, 16):
        x = pixels(model, seed=1, n=n)
        noisy = torch.cat([recorded(model, x, "embed", ablate_tokens([1], mode="noise", seed=s,
                                                                    reference=reference))[0]["embed"][:, 1]
                           for s in range(64 // n + 1)])
        assert torch.allclose(noisy.std(dim=0), target, rtol=0.35), n
    with pytest.raises(VitscopeValueError, match="two images or more"):
        recorded(model, pixels(model, seed=1, n=1), "embed", ablate_tokens([1], mode="noise"))


def test_noise_inside_a_run_depends_on_the_image_not_the_batch(model):
    """With the images' dataset indices known (as in vitscope.run), an image's noise is the same in a batch of
    four, two of two, one by one and on a second forward, and its scale is every reference image's spread."""
    reference = recorded(model, pixels(model, seed=7, n=32), "embed")[0]
    x = pixels(model, seed=1, n=4)

    def noisy(parts, twice=False):
        out = []
        with torch.no_grad(), model.intervene(ablate_tokens([1], mode="noise", seed=2, reference=reference)), \
                model.record("embed") as rec:
            for part in parts:
                with running_images([10 + j for j in part]):
                    for _ in range(2 if twice else 1):
                        model(x[part])
                out.append(rec["embed"][:, 1].clone())
        return torch.cat(out)
    whole = noisy([[0, 1, 2, 3]])
    torch.testing.assert_close(noisy([[0, 1], [2, 3]]), whole, rtol=0, atol=0)
    torch.testing.assert_close(noisy([[0], [1], [2], [3]], twice=True), whole, rtol=0, atol=0)
    target = reference["embed"].std(dim=0)[1]
    draws = []
    with torch.no_grad(), model.intervene(ablate_tokens([1], mode="noise", seed=2, reference=reference)), \
            model.record("embed") as rec:
        for i in range(64):  # one image at a time: the spread is the reference's, not a batch partner's
            with running_images([i]):
                model(x[:1])
            draws.append(rec["embed"][0, 1].clone())
    assert torch.allclose(torch.stack(draws).std(dim=0), target, rtol=0.35)


def test_patching_the_last_block_gives_the_source_runs_output(model):
    clean_x, corrupted_x = pixels(model, seed=0), pixels(model, seed=5)
    last = f"blocks.{model.spec.num_blocks - 1}.resid_post"
    clean, clean_out = recorded(model, clean_x, last)
    _, patched_out = recorded(model, corrupted_x, last, patch(clean, last))
    _, corrupted_out = recorded(model, corrupted_x, last)
    assert torch.equal(patched_out, clean_out) and not torch.equal(corrupted_out, clean_out)
    with pytest.raises(VitscopeValueError, match="nothing to patch"):
        patch(clean, "blocks.0.*")


def test_steering_adds_the_direction(model):
    x = pixels(model)
    site = "blocks.1.resid_post"
    direction = torch.linspace(-1, 1, model.spec.embed_dim)
    clean = recorded(model, x, site)[0][site]
    steered = recorded(model, x, site, steer(site, direction, scale=2.0))[0][site]
    torch.testing.assert_close(steered, clean + 2.0 * direction)
    only = recorded(model, x, site, steer(site, direction, tokens=[0]))[0][site]
    torch.testing.assert_close(only[:, 0], clean[:, 0] + direction)
    assert torch.equal(only[:, 1:], clean[:, 1:])


def test_reference_means_in_one_pass_over_a_folder(model, tmp_path):
    rng = np.random.default_rng(0)
    for i in range(5):
        Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
    means = reference_means(model, str(tmp_path), "blocks.0.resid_post", batch_size=2)
    images = model.preprocess([Image.open(tmp_path / f"{i}.png") for i in range(5)])
    torch.testing.assert_close(means["blocks.0.resid_post"],
                               recorded(model, images, "blocks.0.resid_post")[0]["blocks.0.resid_post"].mean(0),
                               atol=1e-5, rtol=1e-5)


def test_reference_means_of_a_tensor_take_the_limit_and_the_device(model):
    """Given pixels, ``limit`` keeps the first images and ``device`` is resolved as by vitscope.run (they were
    ignored: the mean of every image, on whatever device the model was)."""
    from vitscope.errors import VitscopeUsageError

    reference = pixels(model, n=6, seed=1)
    got = reference_means(model, reference, "embed", limit=2, device="cpu", batch_size=4)["embed"]
    torch.testing.assert_close(got, recorded(model, reference[:2], "embed")[0]["embed"].mean(0))
    with pytest.raises(VitscopeUsageError, match="unknown device 'nope'"):
        reference_means(model, reference, "embed", device="nope")
    with pytest.raises(VitscopeValueError, match="limit must be a whole number"):
        reference_means(model, reference, "embed", limit=0)


def test_token_positions_and_masks_are_checked_in_one_line(model):
    """A position past the sequence, one that is not an integer or a mask of another length is a
    VitscopeValueError naming it, when built or when the edit runs (it was an IndexError inside the forward, or a
    position cut to a whole one)."""
    x = pixels(model, n=2)
    n = recorded(model, x, "embed")[0]["embed"].shape[1]
    for edits in (ablate_tokens([1, 100]), ablate_tokens([1, 100], mode="resample"),
                  steer("embed", torch.ones(model.spec.embed_dim), tokens=[100])):
        with pytest.raises(VitscopeValueError, match=rf"token positions \[100\] do not exist: 'embed' has {n} tokens"):
            recorded(model, x, "embed", edits)
    with pytest.raises(VitscopeValueError, match="needs"):
        recorded(model, x, "embed", ablate_tokens(torch.ones(n + 1, dtype=torch.bool)))
    for bad in ([1.5], torch.tensor([1.0])):
        with pytest.raises(VitscopeValueError, match="token positions are integers"):
            ablate_tokens(bad)
    with pytest.raises(VitscopeValueError, match="list of positions"):
        ablate_tokens(3)
    last = recorded(model, x, "embed", ablate_tokens(torch.tensor([n - 1, 2])))[0]["embed"]  # the last one exists
    assert float(last[:, [2, n - 1]].abs().max()) == 0.0


def test_active_edits_name_the_open_interventions_innermost_last(model):
    def keep(t, name):
        return t

    assert model.active_edits == ()
    with model.intervene({}):
        assert model.active_edits == ()  # nothing edited
    with model.intervene({"blocks.0.resid_post": keep}):
        outer = model.active_edits
        assert len(outer) == 1 and outer[0].names == {"blocks.0.resid_post"}
        with pytest.raises(RuntimeError, match="inside"), model.intervene({"blocks.1.attn.heads": keep}):
            assert model.active_edits[0] is outer[0] and model.active_edits[1].names == {"blocks.1.attn.heads"}
            raise RuntimeError("raised inside")
        assert model.active_edits == outer
    assert model.active_edits == ()
    from vitscope.models.tiled import TiledBackbone

    tiled = TiledBackbone(model)
    with model.intervene({"blocks.0.resid_post": keep}):
        assert tiled.active_edits == model.active_edits != ()  # the tiles run the edited model


@pytest.mark.parametrize("family", ["tiny-vit-sup", "vit-cls"])
@pytest.mark.parametrize("site", ["blocks.1.attn.q", "blocks.1.attn.pattern", "blocks.1.attn.heads",
                                  "blocks.1.resid_post"])
def test_nested_interventions_apply_the_outermost_first_on_every_family_and_site(model, family, site):
    """Outer ``t + 1``, inner ``t * 2``: ``(t + 1) * 2`` everywhere (the timm layout and Hugging Face's blocks ran
    the inner edit first at some sites and the outer at others); closing the inner context keeps the outer's."""
    from helpers.hf_factories import make

    b = model if family == "tiny-vit-sup" else vitscope.wrap(make(family), name=family)
    x = pixels(b, n=2)
    clean = recorded(b, x, site)[0][site]
    with torch.no_grad(), b.intervene({site: lambda t, name: t + 1.0}), b.record(site) as rec:
        with b.intervene({site: lambda t, name: t * 2.0}):
            b(x)
            nested = rec[site].clone()
        rec.clear()
        b(x)
        outer = rec[site].clone()
    torch.testing.assert_close(nested, (clean + 1) * 2)
    torch.testing.assert_close(outer, clean + 1)
    assert recorded(b, x, site)[0][site].equal(clean)  # and nothing is left once both close


def test_edits_of_one_hook_combined_with_or_both_apply(model):
    """``|`` of two ready-made edits naming one hook keeps both (a plain dict kept the right one only)."""
    x, name = pixels(model, n=2), "blocks.2.attn.heads"
    both = recorded(model, x, name, ablate_heads({2: [0]}) | ablate_heads({2: [1]}))[0][name]
    assert both[:, :2].abs().max() == 0 and both[:, 2].abs().max() > 0
    site, ones = "blocks.1.resid_post", torch.ones(model.spec.embed_dim)
    for edits, cls in ((ablate_tokens([0], hooks=site) | steer(site, ones), 1.0),  # zeroed, then steered
                       (steer(site, ones) | ablate_tokens([0], hooks=site), 0.0),
                       ({site: lambda t, n: t * 0} | steer(site, ones), 1.0)):  # a plain dict on the left too
        out = recorded(model, x, site, edits)[0][site]
        torch.testing.assert_close(out[:, 0], torch.full_like(out[:, 0], cls))


def test_bad_edit_arguments_are_refused_in_one_line(model):
    x = pixels(model, n=2)
    for bad, match in ((lambda: ablate_heads({1: 0}), r"heads\[1\] must list the heads"),
                       (lambda: ablate_heads({1: ["a"]}), "a head of block 1 is an integer, got 'a'"),
                       (lambda: ablate_heads({1: [1.5]}), "a head of block 1 is an integer, got 1.5"),
                       (lambda: ablate_heads([1, 2]), "heads maps each block"),
                       (lambda: steer("blocks.1.resid_post", torch.ones(2, 3, 4)), r"\[D\] or \[N, D\]")):
        with pytest.raises(VitscopeValueError, match=match):
            bad()
    width = model.spec.embed_dim
    for edits, match in ((steer("blocks.2.resid_post", torch.ones(width + 3)), rf"needs \[{width}\]"),
                         (steer("blocks.2.resid_post", torch.ones(5, width)), "steering direction is"),
                         (ablate_tokens([0], hooks="blocks.1.attn.heads"), r"not tokens \[B, N, D\]")):
        with pytest.raises(VitscopeValueError, match=match), torch.no_grad(), model.intervene(edits):
            model(x)
    listed = recorded(model, x, "blocks.2.resid_post", steer("blocks.2.resid_post", [1.0] * width))[0]
    assert listed["blocks.2.resid_post"].shape[-1] == width  # a list is a direction too
