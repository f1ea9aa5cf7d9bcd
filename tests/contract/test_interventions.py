"""``backbone.intervene`` on every registered family: an edit that changes nothing changes nothing (bit for bit),
the recorded pattern put back gives the model's outputs (1e-5), a head zeroed through ``attn.heads`` equals the
same head zeroed by hand in the eager model's weights, a recording sees the edited tensors, and nothing is left
behind after the block, also when an edit raises."""

from __future__ import annotations

import pytest
import torch

import vitscope
from helpers.hf_factories import kinds, main_output, make
from vitscope import wrap
from vitscope.hooks.edits import EditError
from vitscope.hooks.names import UnknownHookError
from vitscope.models.hf_layout import attention_module, find_module

TRANSFORMERS = kinds() + ["tiny-vit", "tiny-vit-reg", "tiny-vit-sup"]
CNNS = kinds(cnn=True) + ["tiny-resnet-sup"]


def backbone_of(kind: str, attn_implementation: str | None = None):
    if kind.startswith("tiny-"):
        return vitscope.load_model(kind)
    return wrap(make(kind, attn_implementation=attn_implementation), name=kind)


def pixels(b, seed: int = 0) -> torch.Tensor:
    return torch.randn(2, 3, *b.spec.image_size, generator=torch.Generator().manual_seed(seed))


def hook_counts(model: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def same(t: torch.Tensor, name: str) -> torch.Tensor:
    return t


@pytest.mark.parametrize("kind", TRANSFORMERS + CNNS)
def test_an_edit_that_changes_nothing_changes_nothing(kind: str) -> None:
    b = backbone_of(kind)
    x = pixels(b)
    names = [n for n in b.hook_names() if not n.endswith("attn.pattern")
             and not (n == "final_norm" and not getattr(b, "_norm_on_sequence", True))]  # CLIP: pooled token only
    hooks = hook_counts(b.model)
    with torch.no_grad():
        ref = main_output(b(x))
        with b.intervene({n: same for n in names}):
            edited = main_output(b(x))
    assert torch.equal(edited, ref)
    assert hook_counts(b.model) == hooks


@pytest.mark.parametrize("kind", TRANSFORMERS)
def test_the_recorded_pattern_put_back_gives_the_models_outputs(kind: str) -> None:
    """Every block then runs vitscope's eager-equivalent kernel: the outputs move by kernel rounding only."""
    b = backbone_of(kind)
    x = pixels(b)
    with torch.no_grad():
        ref = main_output(b(x))
        with b.record("blocks.*.attn.pattern") as rec:
            b(x)
        recorded = {k: v.clone() for k, v in rec.items()}
        with b.intervene({"blocks.*.attn.pattern": lambda t, name: recorded[name]}):
            edited = main_output(b(x))
        after = main_output(b(x))
    torch.testing.assert_close(edited, ref, atol=1e-5, rtol=1e-5)
    assert torch.equal(after, ref), "the edit leaked past the block"
    if not kind.startswith("tiny-"):
        assert b.model.config._attn_implementation == "sdpa"


def _zero_head_by_hand(kind: str, block: int, head: int):
    """The eager model with head ``head`` of ``block`` removed from its output projection's weights."""
    b = backbone_of(kind, attn_implementation=None if kind.startswith("tiny-") else "eager")
    dh = b.spec.embed_dim // b.spec.num_heads
    if kind.startswith("tiny-"):
        b.model.blocks[block].attn.fused_attn = False
        proj = b.model.blocks[block].attn.proj
    else:
        proj = find_module(attention_module(b.layers[block], b.family.layout), b.family.layout.o_proj, "o_proj")
    with torch.no_grad():
        proj.weight[:, head * dh:(head + 1) * dh] = 0
    return b


@pytest.mark.parametrize("kind", TRANSFORMERS)
def test_a_head_zeroed_through_its_output_equals_its_weights_zeroed_in_the_eager_model(kind: str) -> None:
    b = backbone_of(kind)
    x = pixels(b)
    block, head = b.spec.num_blocks - 1, b.spec.num_heads - 1

    def zero(t: torch.Tensor, name: str) -> torch.Tensor:
        t = t.clone()
        t[:, head] = 0
        return t

    with torch.no_grad():
        with b.intervene({f"blocks.{block}.attn.heads": zero}), b.record(f"blocks.{block}.attn.heads") as rec:
            edited = main_output(b(x))
        assert float(rec[f"blocks.{block}.attn.heads"][:, head].abs().max()) == 0.0  # the recording sees the edit
        by_hand = main_output(_zero_head_by_hand(kind, block, head)(x))
        assert float((edited - main_output(b(x))).abs().max()) > 1e-6, "zeroing a head changed nothing"
    torch.testing.assert_close(edited, by_hand, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["vit-cls", "dinov2-reg", "clip", "beit", "dinov3", "siglip2", "tiny-vit-sup"])
def test_a_recording_sees_every_edited_site(kind: str) -> None:
    """Residual sites edited by a known change are recorded with it; queries of zero make the pattern uniform."""
    b = backbone_of(kind)
    x = pixels(b)
    sites = ["resid_pre", "norm1", "attn_out", "resid_mid", "norm2", "mlp.post", "mlp_out", "resid_post"]
    with torch.no_grad(), b.record([f"blocks.1.{s}" for s in sites]) as rec:
        b(x)
        clean = {k: v.clone() for k, v in rec.items()}
    for site in sites:
        name = f"blocks.1.{site}"
        with torch.no_grad(), b.intervene({name: lambda t, n: t + 1.0}), b.record(name) as rec:
            b(x)
        torch.testing.assert_close(rec[name], clean[name] + 1.0, atol=1e-5, rtol=1e-5, msg=site)
    if kind != "beit":  # BEiT adds a relative position bias to the logits
        with torch.no_grad(), b.intervene({"blocks.0.attn.q": lambda t, n: torch.zeros_like(t)}), \
                b.record(["blocks.0.attn.pattern", "blocks.0.attn.q"]) as rec:
            b(x)
        pattern = rec["blocks.0.attn.pattern"]
        assert float(rec["blocks.0.attn.q"].abs().max()) == 0.0
        torch.testing.assert_close(pattern, torch.full_like(pattern, 1.0 / pattern.shape[-1]))


@pytest.mark.parametrize("kind", ["vit-cls", "clip", "tiny-vit-sup", "resnet"])
def test_nothing_is_left_behind_when_an_edit_raises(kind: str) -> None:
    b = backbone_of(kind)
    x = pixels(b)
    hooks = hook_counts(b.model)
    site = "stages.0" if kind == "resnet" else "blocks.0.attn.pattern"

    def broken(t: torch.Tensor, name: str) -> torch.Tensor:
        raise RuntimeError("a broken edit")

    with torch.no_grad():
        ref = main_output(b(x))
        with pytest.raises(RuntimeError, match="a broken edit"), b.intervene({site: broken}):
            b(x)
        assert torch.equal(main_output(b(x)), ref) and hook_counts(b.model) == hooks
        if kind in ("vit-cls", "clip"):
            assert b.model.config._attn_implementation == "sdpa"
        if kind == "tiny-vit-sup":
            assert b.model.blocks[0].attn.fused_attn


def test_a_wrong_edit_or_name_fails_in_one_line() -> None:
    b = backbone_of("vit-cls")
    x = pixels(b)
    with pytest.raises(EditError, match=r"the edit of 'blocks.0.resid_post' returned shape \(2, 5\); it must keep"):
        with torch.no_grad(), b.intervene({"blocks.0.resid_post": lambda t, n: t[:, 0, :5]}):
            b(x)
    with pytest.raises(UnknownHookError, match="blocks.9.resid_post"):
        with b.intervene({"blocks.9.resid_post": same}):
            pass
    with pytest.raises(TypeError, match="must be a function"):
        with b.intervene({"blocks.0.resid_post": 3.0}):
            pass
    clip = backbone_of("clip")
    with pytest.raises(EditError, match="final norm is applied to the pooled token only"):
        with clip.intervene({"final_norm": same}):
            pass


@pytest.mark.parametrize("kind", TRANSFORMERS)
def test_a_test_time_register_is_one_more_register_and_moves_the_chosen_units(kind: str) -> None:
    """Every transformer family takes a test-time register after its prefix tokens (or refuses in one line: BEiT's
    relative position bias, a pooling head masking the patches, a Hugging Face classifier averaging the patch tokens,
    which would take the register in), and the register neurons' activations move onto it."""
    from vitscope.interventions.registers import test_time_register, with_test_time_register

    b = backbone_of(kind)
    if kind.startswith("beit") or kind == "siglip2-cls":
        with pytest.raises(ValueError, match="relative position bias|cannot take one more token"):
            with_test_time_register(b)
        return
    if kind in ("dinov2", "clip-cls", "ijepa-cls", "metaclip2-cls"):  # their heads average the patch tokens
        with pytest.raises(ValueError, match="classifier pools the patch tokens"):
            with_test_time_register(b)
        return
    registered, edits = test_time_register(b, {0: [0, 1]})
    p = b.spec.num_prefix_tokens
    assert registered.spec.num_prefix_tokens == p + 1 and registered.spec.prefix_kinds[-1] == "reg"
    x = pixels(b)
    seen = {}
    with torch.no_grad(), registered.intervene(edits), registered.record(["blocks.0.mlp.post",
                                                                          "blocks.0.resid_pre"]) as rec:
        registered(x)
        seen = {k: rec[k].clone() for k in ("blocks.0.mlp.post", "blocks.0.resid_pre")}
    assert seen["blocks.0.resid_pre"].shape[1] == b.spec.num_tokens + 1
    act = seen["blocks.0.mlp.post"]
    assert torch.all(act[:, p + 1:, :2] == 0)  # the patches' activations moved ...
    assert torch.all(act[:, p, 0] == act[:, p, 1]) and torch.all(act[:, p, 0] != 0)  # ... onto the register


@pytest.mark.parametrize("kind", ["vit-cls", "tiny-vit-sup"])
def test_contexts_on_one_block_nest(kind: str) -> None:
    """An intervention or a recording opened inside another on the same block keeps the outer one working: the
    outer edit still applies inside and after, every recording sees the pattern the block used, and an attribution
    (which records every pattern) may run inside a user's recording."""
    from vitscope.attribution import attribute

    b = backbone_of(kind)
    x = pixels(b)

    def first_key_dropped(t, name):
        t = t.clone()
        t[..., 0] = 0
        return t

    with torch.no_grad():
        clean = main_output(b(x))
        with b.intervene({"blocks.1.attn.pattern": first_key_dropped}):
            edited = main_output(b(x))
            with b.intervene({"blocks.1.attn.q": same}):
                inner = main_output(b(x))
            after = main_output(b(x))
            with b.record("blocks.1.attn.pattern") as outer, b.record("blocks.1.attn.pattern") as nested:
                b(x)
                seen = (outer["blocks.1.attn.pattern"].clone(), nested["blocks.1.attn.pattern"].clone())
    assert float((edited - clean).abs().max()) > 1e-4
    torch.testing.assert_close(inner, edited)
    torch.testing.assert_close(after, edited)
    assert all(float(p[..., 0].abs().max()) == 0.0 for p in seen)  # the edited pattern, in both recordings
    with b.record("blocks.*.attn.pattern") as rec:
        attribute(b, x, 0 if b.spec.has_head else torch.randn(b.spec.embed_dim), "chefer")
        with torch.no_grad():
            torch.testing.assert_close(main_output(b(x)), clean)
        assert rec["blocks.1.attn.pattern"].shape[-1] == b.spec.num_tokens
    with torch.no_grad():
        torch.testing.assert_close(main_output(b(x)), clean)  # every context gone
