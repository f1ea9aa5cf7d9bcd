"""Last-layer token mixing (paper 001 section 4): head on every token, CLS isolated until block L."""

from __future__ import annotations

import pytest
import torch

import vitscope
from vitscope.analyses.batch import Batch, ModelRunner
from vitscope.data.memory import InMemoryImages
from vitscope.experiments.token_mixing import (
    TokenMixing,
    isolated_cls_logits,
    per_token_logits,
    token_mixing,
)
from vitscope.train.data import normalise, synthetic_split


@pytest.fixture(scope="module")
def tiny():
    return vitscope.load_model("tiny-vit-sup")


@pytest.fixture(scope="module")
def world():
    return synthetic_split(48, seed=5, size=64)


@pytest.fixture(scope="module")
def data(tiny, world):
    return normalise(world.images, tiny.spec.mean, tiny.spec.std), world.labels


@pytest.fixture(scope="module")
def images(world):
    """The same 8-bit images with their labels, as a source for vitscope.run."""
    return InMemoryImages(list(world.images.permute(0, 2, 3, 1).numpy()), labels=world.labels.tolist())


def _batch(backbone, pixels: torch.Tensor, labels: torch.Tensor) -> Batch:
    """One batch as the engine hands it over (the model included)."""
    spec = backbone.spec
    return Batch(pixels, list(range(len(labels))), [""] * len(labels), spec, spec.grid_for(*pixels.shape[-2:]),
                 targets={"label": labels.tolist()}, model=ModelRunner(backbone))


@pytest.fixture(scope="module")
def hf_vit():
    from helpers.hf_factories import make

    return vitscope.wrap(make("vit-cls"))


def test_head_at_cls_reproduces_the_tiny_model(tiny, data) -> None:
    x = data[0][:16]
    with torch.no_grad():
        want = tiny(x)
    logits = per_token_logits(tiny, x)
    assert logits.shape == (16, tiny.spec.num_tokens, 10)
    # the head runs on B*N rows instead of B, so the BLAS kernel may differ in the last bit
    torch.testing.assert_close(logits[:, 0], want, rtol=1e-6, atol=1e-6)
    assert torch.equal(logits[:, 0].argmax(-1), want.argmax(-1))


def test_head_at_cls_reproduces_an_hf_classifier(hf_vit) -> None:
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = hf_vit(x).logits
    logits = per_token_logits(hf_vit, x)
    assert logits.shape == (4, hf_vit.spec.num_tokens, 5)
    torch.testing.assert_close(logits[:, 0], want, rtol=1e-6, atol=1e-6)


def test_head_on_a_patch_token_is_the_classifier_of_that_token(tiny, data) -> None:
    x = data[0][:4]
    with torch.no_grad():
        seq = tiny.final_norm(tiny.run_blocks(tiny.embed(x)))
        want = tiny.model.head(seq[:, 9])
    torch.testing.assert_close(per_token_logits(tiny, x)[:, 9], want, rtol=1e-5, atol=1e-5)


def test_the_head_on_the_mean_patch_token_is_the_reference_codes_patch_average(tiny, data) -> None:
    """The authors' code's AVG(Patches-CLS): ``fc(norm(x)[:, 1:].mean(1))``, counted beside the paper's patch
    average (the mean over positions of the head on one patch)."""
    x, y = data
    with torch.no_grad():
        seq = tiny.final_norm(tiny.run_blocks(tiny.embed(x)))
        want = int((tiny.model.head(seq[:, 1:].mean(1)).argmax(-1) == y).sum()) / len(y)
    analysis = TokenMixing(insert_blocks=[0])
    analysis.update({}, _batch(tiny, x, y))
    m = analysis.compute().meta
    assert m["mean_patch_token_accuracy"] == want
    assert m["mean_patch_token_accuracy"] != m["patch_average"]  # two quantities, told apart


@pytest.mark.parametrize("which", ["tiny", "hf"])
def test_isolating_cls(which, tiny, hf_vit, data) -> None:
    backbone = tiny if which == "tiny" else hf_vit
    x = data[0][:6] if which == "tiny" else torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = backbone(x)
    want = getattr(out, "logits", out)
    assert torch.equal(isolated_cls_logits(backbone, x, 0), want)  # L = 0 is the unmodified model
    # CLS joined at the last block differs from the model, but still depends on the image
    last = isolated_cls_logits(backbone, x, backbone.spec.num_blocks - 1)
    assert not torch.allclose(last, want) and not torch.allclose(last, last[:1].expand_as(last))
    # CLS never sees the image: the same logits for every image
    never = isolated_cls_logits(backbone, x, backbone.spec.num_blocks)
    torch.testing.assert_close(never, never[:1].expand_as(never))
    with pytest.raises(ValueError, match="insert_at"):
        isolated_cls_logits(backbone, x, backbone.spec.num_blocks + 1)


@pytest.mark.parametrize("mean_pooling", [False, True], ids=["cls-head", "mean-head"])
def test_isolating_cls_in_beit_is_the_full_model_with_prefix_and_patches_blocked_from_each_other(mean_pooling) -> None:
    """BEiT's blocks add a relative position bias between token places: the patches that run without the prefix
    take the bias at their own places, which is the whole sequence with attention between the prefix and the
    patches set to -inf in the blocks before L (the bias hooked on the unmodified model)."""
    import transformers as tf

    from helpers.hf_factories import SMALL

    torch.manual_seed(0)
    model = tf.BeitForImageClassification(tf.BeitConfig(**SMALL, use_relative_position_bias=True, num_labels=5,
                                                        use_mean_pooling=mean_pooling, layer_scale_init_value=0.3))
    backbone = vitscope.wrap(model.eval())
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    p = backbone.spec.num_prefix_tokens

    def blocked(module, args, bias):
        bias = bias.clone()
        bias[..., :p, p:] = float("-inf")
        bias[..., p:, :p] = float("-inf")
        return bias

    for insert_at in range(backbone.spec.num_blocks + 1):
        handles = [layer.relative_position_bias.register_forward_hook(blocked)
                   for layer in backbone.layers[:insert_at]]
        try:
            with torch.no_grad():
                want = model(x).logits
        finally:
            for handle in handles:
                handle.remove()
        torch.testing.assert_close(isolated_cls_logits(backbone, x, insert_at), want, rtol=1e-6, atol=1e-6)
    never = isolated_cls_logits(backbone, x, backbone.spec.num_blocks)
    assert torch.allclose(never, never[:1].expand_as(never)) != mean_pooling  # a CLS head never sees the image


def test_counts_merge_exactly_and_accuracies_are_consistent(tiny, data) -> None:
    x, y = data
    whole = TokenMixing()
    for part in (slice(0, 20), slice(20, None)):
        whole.update({}, _batch(tiny, x[part], y[part]))
    a, b = TokenMixing(insert_blocks=list(range(7))), TokenMixing(insert_blocks=list(range(7)))
    a.update({}, _batch(tiny, x[:30], y[:30]))
    b.update({}, _batch(tiny, x[30:], y[30:]))
    merged, whole = a.merge(b).compute(), whole.compute()
    for key in whole.tensors:
        assert torch.equal(merged[key], whole[key]), key
    assert merged.meta == whole.meta
    m = whole.meta
    assert m["num_images"] == 48
    assert m["cls_token_accuracy"] == m["model_accuracy"] == m["isolate_cls"]["0"]
    assert m["patch_minimum"] <= m["patch_average"] <= m["patch_maximum"]
    assert whole["token_accuracy_grid"].shape == (8, 8)
    assert m["model_accuracy"] > 0.5  # the tiny classifier works on its own synthetic world


def test_token_mixing_refuses_models_without_a_head() -> None:
    with pytest.raises(ValueError, match="classifier"):
        per_token_logits(vitscope.load_model("tiny-vit-mae"), torch.zeros(1, 3, 64, 64))


def test_one_pass_of_the_engine_gives_the_counts_of_its_batches(tiny, data, images) -> None:
    res = token_mixing(tiny, images, insert_blocks=[0, 6], batch_size=16)
    direct = TokenMixing(insert_blocks=[0, 6])
    direct.update({}, _batch(tiny, *data))
    want = direct.compute()
    assert res.meta["num_images"] == 48 and res["isolate_cls_block"].tolist() == [0, 6]
    for key in want.tensors:  # the engine preprocesses the same 8-bit images into the same pixels
        assert torch.equal(res[key], want[key]), key
    assert res.meta["cls_token_accuracy"] == res.meta["model_accuracy"] == res.meta["isolate_cls"]["0"]


def test_unlabelled_data_and_headless_models_are_refused(tiny, images) -> None:
    with pytest.raises(ValueError, match="class label"):
        token_mixing(tiny, InMemoryImages(images.images[:4]), batch_size=4)
    assert "classifier" in TokenMixing().why_unsupported(vitscope.load_model("tiny-vit-mae").spec)


def test_labels_beyond_the_head_are_refused(tiny, data) -> None:
    x, y = data
    with pytest.raises(ValueError, match="label 10 is not one of tiny-vit-sup's 10 classes"):
        TokenMixing(insert_blocks=[0]).update({}, _batch(tiny, x[:2], torch.tensor([3, 10])))


def test_result_plots(tiny, images, tmp_path) -> None:
    res = token_mixing(tiny, images, insert_blocks=[0, 5], limit=8, batch_size=8)
    assert res["isolate_cls_accuracy"].shape == (2,)
    files = res.plot(tmp_path)
    assert len(files) == 2 and all(p.stat().st_size > 0 for p in files)


def test_images_of_several_token_grids_keep_their_token_counts_per_grid(world) -> None:
    """With keep_aspect a position is a different place on each grid: the counts of each grid are those of its own
    images, each run alone; CLS and the patch average are over every image."""
    from PIL import Image

    backbone = vitscope.load_model("tiny-vit-sup", keep_aspect=True)
    sizes = ((64, 32), (32, 64), (48, 48))  # (width, height): grids 5x10, 10x5 (as many tokens) and 8x8
    pictures = [Image.fromarray(world.images[i].permute(1, 2, 0).numpy()).resize(sizes[i % 3]) for i in range(10)]
    labels = world.labels[:10].tolist()
    res = token_mixing(backbone, InMemoryImages(pictures, labels=labels), insert_blocks=[0], batch_size=4)
    correct, images, patch_accuracies = {}, {}, []
    for picture, label in zip(pictures, labels):  # each image alone: its own grid, nothing mixed
        pixels = backbone.preprocess([picture])
        hits = (per_token_logits(backbone, pixels)[0].argmax(-1) == label).double()
        grid = backbone.spec.grid_for(*pixels.shape[-2:])
        key = f"{grid[0]}x{grid[1]}"
        correct[key] = correct.get(key, 0) + hits
        images[key] = images.get(key, 0) + 1
        patch_accuracies.append(float(hits[1:].mean()))
    assert res.meta["grids"] == {"5x10": 4, "8x8": 3, "10x5": 3}  # most images first, ties by the smaller grid
    for j, (key, n) in enumerate(res.meta["grids"].items()):
        suffix = "" if j == 0 else f"@{key}"
        torch.testing.assert_close(res[f"token_accuracy{suffix}"], correct[key] / n, rtol=0, atol=1e-12)
        assert res[f"token_accuracy_grid{suffix}"].shape == tuple(int(v) for v in key.split("x"))
    assert res.meta["cls_token_accuracy"] == pytest.approx(sum(float(c[0]) for c in correct.values()) / 10)
    assert res.meta["patch_average"] == pytest.approx(sum(patch_accuracies) / 10)
    assert res.meta["patch_maximum"] == float(res["token_accuracy_grid"].max())
