"""Every attribution method equals the same definition computed with eager attention and autograd (1e-5), on
models that keep their default fused kernel: HF ViT, DeiT, DINOv2 with registers, CLIP, the zoo's ViTs, and a CNN
for Grad-CAM. The reference here is written from the methods' papers, not from vitscope's code."""

from __future__ import annotations

import pytest
import torch

import vitscope
from helpers.hf_factories import make, peaked
from vitscope import wrap
from vitscope.attribution import attribute
from vitscope.attribution.methods import METHODS
from vitscope.errors import VitscopeError

KINDS = ["vit-cls", "deit", "dinov2-reg", "clip", "tiny-vit-sup", "tiny-vit-reg"]


def models(kind: str):
    """(vitscope backbone on the default kernel, eager twin as a plain module, its backbone)."""
    if kind.startswith("tiny-"):
        b = vitscope.load_model(kind)
        twin = vitscope.load_model(kind)
        for blk in twin.model.blocks:
            blk.attn.fused_attn = False
        return b, twin.model, twin
    b = wrap(peaked(make(kind)), name=kind)
    eager = peaked(make(kind, attn_implementation="eager"))
    return b, eager, wrap(eager, name=kind)


def pixels_of(b, seed: int = 0) -> torch.Tensor:
    return torch.randn(2, 3, *b.spec.image_size, generator=torch.Generator().manual_seed(seed))


def eager_forward(kind: str, twin_b, x: torch.Tensor, target):
    """``(score [B], patterns in the graph, tokens after every block)`` of the eager twin."""
    model, spec = twin_b.model, twin_b.spec
    patterns: list[torch.Tensor] = []
    if kind.startswith("tiny-"):
        handles = [blk.attn.attn_drop.register_forward_hook(lambda m, a, out: patterns.append(out))
                   for blk in model.blocks]
        try:
            out = model(x)
        finally:
            for h in handles:
                h.remove()
        final = None
    else:
        out = model(pixel_values=x, output_attentions=True, output_hidden_states=True)
        patterns = list(out.attentions)
        final = twin_b.final_norm(out.hidden_states[-1])
    if spec.has_head:
        logits = out if isinstance(out, torch.Tensor) else out.logits
        return logits.gather(1, target[:, None])[:, 0], patterns, final
    emb = final[:, 0]  # every embedding model here has a CLS token
    return torch.nn.functional.cosine_similarity(emb, target.expand_as(emb), dim=-1), patterns, final


def target_of(b):
    if b.spec.has_head:
        return torch.tensor([1, 3])
    return torch.randn(b.spec.embed_dim, generator=torch.Generator().manual_seed(7))


def cls_row(r: torch.Tensor, spec) -> torch.Tensor:
    """The row of the token(s) the score reads: the CLS token's; the distilled DeiT classifier averages the heads of
    its CLS and distillation tokens, so the mean of their two rows."""
    reads = [0, 1] if spec.has_head and tuple(spec.prefix_kinds)[:2] == ("cls", "dist") else [0]
    return r[:, reads, spec.num_prefix_tokens:].mean(dim=1).reshape(-1, *spec.grid)


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    scale = float(want.abs().max()) or 1.0
    assert got.shape == want.shape
    assert float((got - want).abs().max()) <= 1e-5 * scale + 1e-7, float((got - want).abs().max()) / scale


@pytest.mark.parametrize("kind", KINDS)
def test_chefer_equals_eager_autograd(kind: str) -> None:
    b, _, twin = models(kind)
    x, target = pixels_of(b), target_of(b)
    got = attribute(b, x, target, "chefer")
    score, patterns, _ = eager_forward(kind, twin, x, target)
    grads = torch.autograd.grad(score.sum(), patterns)
    n = patterns[0].shape[-1]
    r = torch.eye(n).expand(x.shape[0], n, n)
    for a, g in zip(patterns, grads):
        r = r + (g * a).clamp(min=0).mean(dim=1) @ r
    close(got, cls_row(r, b.spec).detach())
    assert float(got.abs().max()) > 0


@pytest.mark.parametrize("kind", ["beit", "tiny-vit-metric"])
def test_a_mean_pooling_classifier_is_explained_from_the_rows_it_reads(kind: str) -> None:
    """BEiT's classifier and a timm ViT with global_pool="avg" read the mean of the spatial tokens: the score has no
    gradient on the last block's CLS row, so the maps take the mean of the spatial rows (Chefer's R, rollout)."""
    b, _, twin = models(kind)
    x, target = pixels_of(b), target_of(b)
    got = attribute(b, x, target, "chefer")
    score, patterns, _ = eager_forward(kind, twin, x, target)
    grads = torch.autograd.grad(score.sum(), patterns)
    assert float(grads[-1][:, :, 0].abs().max()) == 0.0  # the CLS row of the last block is not read
    n, p = patterns[0].shape[-1], b.spec.num_prefix_tokens
    r = torch.eye(n).expand(x.shape[0], n, n)
    for a, g in zip(patterns, grads):
        r = r + (g * a).clamp(min=0).mean(dim=1) @ r
    mean_row = lambda m: m[:, p:, p:].mean(dim=1).reshape(-1, *b.spec.grid).detach()
    close(got, mean_row(r))
    assert float((got - cls_row(r, b.spec).detach()).abs().max()) > 1e-3 * float(got.abs().max())
    with torch.no_grad():
        close(attribute(b, x, target, "attention"), mean_row(patterns[-1].mean(dim=1)))


@pytest.mark.parametrize("kind", KINDS)
def test_attention_and_rollout_equal_the_eager_patterns(kind: str) -> None:
    b, _, twin = models(kind)
    x, target = pixels_of(b), target_of(b)
    with torch.no_grad():
        _, patterns, _ = eager_forward(kind, twin, x, target)
    close(attribute(b, x, target, "attention"), cls_row(patterns[-1].mean(dim=1), b.spec))
    r = None
    for a in patterns:
        a_hat = a.mean(dim=1) + torch.eye(a.shape[-1])
        a_hat = a_hat / a_hat.sum(-1, keepdim=True)
        r = a_hat if r is None else a_hat @ r
    close(attribute(b, x, target, "rollout"), cls_row(r, b.spec))


@pytest.mark.parametrize("kind", KINDS)
def test_token_gradcam_and_input_gradients_equal_eager_autograd(kind: str) -> None:
    b, model, twin = models(kind)
    x, target = pixels_of(b), target_of(b)
    last = b.spec.num_blocks - 1
    norm = model.blocks[last].norm1 if kind.startswith("tiny-") else twin.blocks[last].norm1
    seen = []
    handle = norm.register_forward_hook(lambda m, a, out: seen.append(out))
    try:
        score, _, _ = eager_forward(kind, twin, x, target)
    finally:
        handle.remove()
    (grad,) = torch.autograd.grad(score.sum(), seen[0])
    p = b.spec.num_prefix_tokens
    cam = torch.relu((grad[:, p:].mean(1, keepdim=True) * seen[0][:, p:]).sum(-1)).reshape(-1, *b.spec.grid)
    close(attribute(b, x, target, "token_gradcam"), cam.detach())
    xg = x.clone().requires_grad_(True)
    score, _, _ = eager_forward(kind, twin, xg, target)
    (gx,) = torch.autograd.grad(score.sum(), xg)
    close(attribute(b, x, target, "input_x_gradient"), (gx * xg).sum(1).detach())


@pytest.mark.parametrize("kind", KINDS)
def test_integrated_gradients_equal_captums_on_the_eager_model(kind: str) -> None:
    from captum.attr import IntegratedGradients

    b, _, twin = models(kind)
    x, target = pixels_of(b), target_of(b)
    got = attribute(b, x, target, "integrated_gradients", steps=4, baseline=0.5)

    def forward(inp: torch.Tensor) -> torch.Tensor:  # the eager twin's score of every copy captum makes
        reps = inp.shape[0] // x.shape[0]
        return eager_forward(kind, twin, inp, target.repeat(reps) if target.dtype == torch.long else target)[0]

    want = IntegratedGradients(forward).attribute(x, baselines=torch.full_like(x, 0.5), n_steps=4).sum(1)
    close(got, want.detach())


def test_gradcam_of_a_cnn_equals_eager_autograd() -> None:
    b = wrap(make("resnet"), name="resnet")
    x, target = pixels_of(b), torch.tensor([0, 4])
    got = attribute(b, x, target, "gradcam")
    with b.record(f"stages.{b.spec.num_blocks - 1}", detach=False) as rec:
        logits = b(x).logits
    act = rec[f"stages.{b.spec.num_blocks - 1}"]
    (grad,) = torch.autograd.grad(logits.gather(1, target[:, None]).sum(), act)
    close(got, torch.relu((grad.mean((2, 3), keepdim=True) * act).sum(1)).detach())
    assert attribute(b, x, target, "gradcam", upsample=True).shape == (2, *b.spec.image_size)


def test_a_cnn_without_a_head_explains_the_cosine_of_its_mean_pooled_map() -> None:
    """A headless BiT (its last map normed, then averaged as the model's own pooler does): the score is the cosine
    of that embedding to the target, for Grad-CAM and the pixel methods."""
    b = wrap(make("bit"), name="bit")
    assert not b.spec.has_head and not b.spec.is_transformer
    x = pixels_of(b)
    target = torch.randn(2, b.spec.embed_dim, generator=torch.Generator().manual_seed(7))
    last = f"stages.{b.spec.num_blocks - 1}"
    xg = x.clone().requires_grad_(True)
    with b.record(last, detach=False) as rec:
        emb = b.model(pixel_values=xg).pooler_output.flatten(1)  # the model's own pooled embedding
    score = torch.nn.functional.cosine_similarity(emb, target, dim=-1)
    act = rec[last]
    grad_act, grad_x = torch.autograd.grad(score.sum(), [act, xg])
    close(attribute(b, x, target, "gradcam"), torch.relu((grad_act.mean((2, 3), keepdim=True) * act).sum(1)).detach())
    close(attribute(b, x, target, "input_x_gradient"), (grad_x * x).sum(1))


@pytest.mark.parametrize("kind", ["vit-cls", "tiny-vit-sup"])
def test_the_model_is_left_as_found(kind: str) -> None:
    b, _, _ = models(kind)
    x = pixels_of(b)
    before = x.clone()
    ref = b(x)
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in b.model.modules())
    grads = [p.requires_grad for p in b.model.parameters()]
    for method in ("chefer", "token_gradcam", "input_x_gradient", "rollout"):
        with torch.no_grad():  # gradients inside, whatever the caller's mode
            assert float(attribute(b, x, target_of(b), method).abs().max()) > 0
    if not kind.startswith("tiny-"):
        assert b.model.config._attn_implementation == "sdpa"
    assert torch.equal(x, before) and all(p.grad is None for p in b.model.parameters())
    assert [p.requires_grad for p in b.model.parameters()] == grads and not b.model.training
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in b.model.modules()) == hooks
    out = b(x)
    assert torch.equal(out if isinstance(out, torch.Tensor) else out.logits,
                       ref if isinstance(ref, torch.Tensor) else ref.logits)


def test_bad_input_is_one_line() -> None:
    b = vitscope.load_model("tiny-vit-sup")
    x = pixels_of(b)
    cases = [(lambda: attribute(b, x, 0, "lime"), "unknown attribution method 'lime'"),
             (lambda: attribute(b, x, 99, "chefer"), "target class 99 is out of range"),
             (lambda: attribute(b, x, 0, "gradcam"), "is for CNNs"),
             (lambda: attribute(b, x, 0, "token_gradcam", hook="blocks.9.norm1"), "blocks.9.norm1"),
             (lambda: attribute(b, x, 0, "rollout", steps=3), "has no option 'steps'"),
             (lambda: attribute(wrap(make("resnet")), x, 0, "chefer"), "is a CNN")]
    for call, message in cases:
        with pytest.raises(VitscopeError, match=message) as err:
            call()
        assert "\n" not in str(err.value)
    embedding = wrap(make("dinov2-reg"), name="dinov2-reg")
    for method in sorted(m for m, (_, kind) in METHODS.items() if kind != "cnn"):  # attention, rollout too
        with pytest.raises(VitscopeError, match="target class 99 is out of range"):
            attribute(b, x, 99, method)
        with pytest.raises(VitscopeError, match="has width 5"):
            attribute(embedding, pixels_of(embedding), torch.randn(5), method)
    with torch.inference_mode(), pytest.raises(VitscopeError, match="inference_mode"):
        attribute(b, x, 0, "chefer")


def test_targets_and_baselines_are_checked_in_one_line() -> None:
    """The class out of range is the one named (not the largest), a class that is not an integer is refused (2.7
    was cut to 2), and integrated gradients' baseline is a number or one image's or every image's pixels."""
    b = vitscope.load_model("tiny-vit-sup")
    x = pixels_of(b)
    cases = [(lambda: attribute(b, x, [3, -1], "chefer"), r"target class -1 is out of range"),
             (lambda: attribute(b, x, 2.7, "chefer"), r"a class index \(an int, or one per image\), got 2.7"),
             (lambda: attribute(b, x, torch.tensor([1.0, 2.0]), "chefer"), "a class index"),
             (lambda: attribute(b, x, "cat", "chefer"), "a class index"),
             (lambda: attribute(b, x, 0, "integrated_gradients", steps=2, baseline=torch.zeros(3, *x.shape[1:])),
              r"matching the pixels \(2, 3, 64, 64\), got a tensor of shape \(3, 3, 64, 64\)"),
             (lambda: attribute(b, x, 0, "integrated_gradients", steps=2, baseline=[0.1, 0.2, 0.3]),
              r"baseline must be a number or a tensor .* got \[0.1, 0.2, 0.3\]")]
    for call, message in cases:
        with pytest.raises(VitscopeError, match=message) as err:
            call()
        assert "\n" not in str(err.value)
    whole = attribute(b, x, 0, "integrated_gradients", steps=2, baseline=torch.full_like(x, 0.5))
    for same in (0.5, torch.full(x.shape[1:], 0.5), torch.full((1, *x.shape[1:]), 0.5), torch.tensor(0.5)):
        torch.testing.assert_close(attribute(b, x, 0, "integrated_gradients", steps=2, baseline=same), whole)


def test_a_frozen_model_is_explained_as_the_same_model_unfrozen() -> None:
    """A backbone whose parameters need no gradient (a frozen probe setup) gives the same maps."""
    for name, methods in (("tiny-vit-sup", ("chefer", "token_gradcam")), ("tiny-resnet-sup", ("gradcam",))):
        b = vitscope.load_model(name)
        x, target = pixels_of(b), target_of(b)
        want = {m: attribute(b, x, target, m) for m in methods}
        b.model.requires_grad_(False)
        for m in methods:
            torch.testing.assert_close(attribute(b, x, target, m), want[m], rtol=0, atol=0)
        assert not any(p.requires_grad for p in b.model.parameters())
