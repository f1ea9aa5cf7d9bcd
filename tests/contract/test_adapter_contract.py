"""Every adapter family goes through the same checks: spec, recording, exact attention, staged execution."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch

from helpers.hf_factories import kinds, main_output, make, peaked
from vitscope import wrap
from vitscope.errors import VitscopeValueError
from vitscope.hooks.names import BLOCK_SITES, UnknownHookError
from vitscope.models.registry import registry

TRANSFORMER_KINDS, CNN_KINDS = kinds(), kinds(cnn=True)  # every registered test factory, wherever it sits
TINY = [name for name, e in registry().items() if e.builder is not None]
TINY_CNNS = [name for name in TINY if registry()[name].family == "tiny-resnet"]


def _backbone(kind: str):
    if kind.startswith("tiny-"):
        import vitscope

        return vitscope.load_model(kind)
    return wrap(make(kind), name=kind)


def _pixels(b, n=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, *b.spec.image_size, generator=g)


TRANSFORMERS = TRANSFORMER_KINDS + [t for t in TINY if t not in TINY_CNNS]


@pytest.mark.parametrize("kind", TRANSFORMERS)
def test_transformer_spec_and_shapes(kind):
    b = _backbone(kind)
    s = b.spec
    assert s.num_prefix_tokens == len(s.prefix_kinds)
    assert list(s.prefix_kinds) == sorted(s.prefix_kinds, key=["cls", "dist", "reg"].index)
    x = _pixels(b)
    with torch.no_grad(), b.record("blocks.*") as rec:
        b(x)
    n, d, h = s.num_tokens, s.embed_dim, s.num_heads
    for i in range(s.num_blocks):
        for site in BLOCK_SITES:
            t = rec[f"blocks.{i}.{site}"]
            expected = {"attn.pattern": (2, h, n, n), "mlp.post": (2, n, s.mlp_dim)}.get(site, (2, n, d))
            if site in ("attn.q", "attn.k", "attn.v", "attn.heads"):
                expected = (2, h, n, d // h)
            assert tuple(t.shape) == expected, (site, t.shape)
    assert rec["blocks.0.attn.pattern"].dtype == torch.float32


@pytest.mark.parametrize("kind", TRANSFORMERS)
def test_recording_leaves_output_unchanged(kind):
    b = _backbone(kind)
    x = _pixels(b)
    with torch.no_grad():
        ref = main_output(b(x))
        with b.record(["blocks.*.attn.pattern", "blocks.*.resid_post", "final_norm"]):
            got = main_output(b(x))
        after = main_output(b(x))
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    scale = float(ref.abs().max())
    assert float((got - ref).abs().max()) <= 1e-5 * scale, "recording moved the output by more than 1e-5 relative"
    assert torch.equal(after, ref), "hooks were not removed"
    with torch.no_grad(), b.record(["blocks.*.resid_post", "blocks.*.mlp.post", "blocks.0.attn.q"]):
        untouched = main_output(b(x))
    assert torch.equal(untouched, ref), "no kernel is switched here: the output must be bit-identical"
    if kind.startswith("tiny-"):  # no kernel is switched for the timm layout: bit-identical
        assert torch.equal(got, ref)


@pytest.mark.parametrize("kind", TRANSFORMER_KINDS)
def test_hf_patterns_equal_eager_attention(kind):
    """Models on their default (sdpa) kernel: recorded patterns == eager attentions to 1e-5, with attention far
    from uniform (the query and key projections scaled up in both)."""
    b = wrap(peaked(make(kind)), name=kind)
    assert b.model.config._attn_implementation == "sdpa"
    eager = peaked(make(kind, attn_implementation="eager"))
    x = _pixels(b)
    kw = {"noise": torch.arange(b.spec.num_spatial_tokens, dtype=torch.float32).expand(2, -1)} if kind == "mae" else {}
    with torch.no_grad():
        with b.record("blocks.*.attn.pattern") as rec:
            b(x)
        ref = wrap(eager, name=kind)(x, output_attentions=True, **kw).attentions  # the model's own inputs
    assert len(ref) == b.spec.num_blocks
    for i, a in enumerate(ref):
        p = rec[f"blocks.{i}.attn.pattern"]
        torch.testing.assert_close(p, a.float(), atol=1e-5, rtol=0)
        torch.testing.assert_close(p.sum(-1), torch.ones_like(p.sum(-1)), atol=1e-5, rtol=0)
        assert float(p.amax(-1).mean()) > 3.0 / p.shape[-1], f"block {i}: attention is nearly uniform"
    assert b.model.config._attn_implementation == "sdpa", "kernel not restored"


def test_beit_relative_bias_is_in_the_pattern():
    """Without the bias the pattern would differ: the test above would catch a dropped bias."""
    b = _backbone("beit")
    x = _pixels(b)
    with torch.no_grad(), b.record(["blocks.0.attn.pattern", "blocks.0.attn.q", "blocks.0.attn.k"]) as rec:
        b(x)
    q, k = rec["blocks.0.attn.q"], rec["blocks.0.attn.k"]
    no_bias = torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, -1)
    assert (no_bias - rec["blocks.0.attn.pattern"]).abs().max() > 1e-4


@pytest.mark.parametrize("kind", [t for t in TINY if t not in TINY_CNNS])
def test_timm_layout_fused_equals_eager(kind):
    b = _backbone(kind)
    x = _pixels(b)
    assert all(blk.attn.fused_attn for blk in b.model.blocks)
    with torch.no_grad(), b.record("blocks.*.attn.pattern") as rec:
        b(x)
    fused = {k: v.clone() for k, v in rec.items()}
    # eager reference: timm's own non-fused path, read through a hook on attn_drop
    eager: dict[int, torch.Tensor] = {}
    hooks = []
    for i, blk in enumerate(b.model.blocks):
        blk.attn.fused_attn = False
        hooks.append(blk.attn.attn_drop.register_forward_hook(lambda m, a, o, i=i: eager.__setitem__(i, o)))
    try:
        with torch.no_grad():
            b(x)
    finally:
        for h in hooks:
            h.remove()
        for blk in b.model.blocks:
            blk.attn.fused_attn = True
    for i in range(b.spec.num_blocks):
        torch.testing.assert_close(fused[f"blocks.{i}.attn.pattern"], eager[i], atol=1e-5, rtol=0)


def _recorded(b, x, names):
    """The model's output on ``x`` and copies of the tensors recorded by its forward, the record closed: staged
    calls made later record nothing over them."""
    with torch.no_grad(), b.record(names) as rec:
        out = b(x)
        recorded = {name: t.clone() for name, t in rec.items()}
    return out, recorded


@pytest.mark.parametrize("grid", ["own", "same count"])
@pytest.mark.parametrize("kind", TRANSFORMERS)
def test_staged_execution_matches_forward(kind, grid):
    """embed -> run_blocks -> final_norm (-> head) equals the forward, at the model's own grid and at another grid
    of as many tokens (4x4 -> 2x8 patches), where blocks that placed tokens by their count would be wrong."""
    b = _backbone(kind)
    x = _pixels(b)
    if grid == "same count":
        if not b.resizable_input:
            pytest.skip(f"{kind} runs at its own input size only")
        (gh, gw), p = b.spec.grid, b.spec.patch_size
        x = torch.randn(2, 3, gh // 2 * p, gw * 2 * p, generator=torch.Generator().manual_seed(0))
    out, rec = _recorded(b, x, ["embed", "blocks.1.resid_post", "final_norm"])
    with torch.no_grad():
        tokens = b.embed(x)
        torch.testing.assert_close(tokens, rec["embed"], atol=1e-5, rtol=0)
        mid = b.run_blocks(tokens, 0, 2)
        torch.testing.assert_close(mid, rec["blocks.1.resid_post"], atol=1e-5, rtol=0)
        last = b.run_blocks(mid, 2)
        normed = b.final_norm(last)
        torch.testing.assert_close(normed, rec["final_norm"], atol=1e-5, rtol=0)
        if b.spec.has_head:
            logits = b.head(normed if b.head_after_final_norm else last)
            torch.testing.assert_close(logits, main_output(out), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", TRANSFORMERS)
def test_residual_sites_add_up(kind):
    b = _backbone(kind)
    with torch.no_grad(), b.record("blocks.1.*") as rec:
        b(_pixels(b))
    r = {k.split(".", 2)[2]: v for k, v in rec.items()}
    torch.testing.assert_close(r["resid_pre"] + r["attn_out"], r["resid_mid"], atol=1e-6, rtol=0)
    torch.testing.assert_close(r["resid_mid"] + r["mlp_out"], r["resid_post"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", TRANSFORMER_KINDS + ["tiny-vit", "tiny-vit-reg"])  # the zoo: tiny ViTs too
def test_transformer_at_another_input_size(kind, one_thread):
    """``--image-size``: a ViT run at a size it was not built for interpolates its position embeddings; the grid
    follows, staged execution still equals the forward and the recorded patterns equal eager attention."""
    from vitscope.models.input_size import with_image_size

    b = _backbone(kind)
    p = b.spec.patch_size
    side = b.spec.image_size[0] + 2 * p  # 32 -> 48 (6x6 tokens), the tiny ViT's 64 -> 80 (10x10)
    if not b.resizable_input:  # one learned position table (AIMv2 at a fixed size): refused, never run wrongly
        with pytest.raises(VitscopeValueError, match=r"runs at 32 px only \(its position embeddings are not"):
            with_image_size(b, side)
        return
    r = with_image_size(b, side)
    assert r.spec.image_size == (side, side) and r.spec.grid == (side // p, side // p)
    assert b.spec.image_size == (side - 2 * p,) * 2, "the given backbone is unchanged"
    x = _pixels(r)
    _, rec = _recorded(r, x, ["blocks.*.attn.pattern", "final_norm"])
    with torch.no_grad():
        staged = r.final_norm(r.run_blocks(r.embed(x)))
    n = r.spec.num_tokens
    assert tuple(rec["blocks.0.attn.pattern"].shape) == (2, r.spec.num_heads, n, n)
    torch.testing.assert_close(staged, rec["final_norm"], atol=1e-5, rtol=0)
    if kind in TRANSFORMER_KINDS:
        eager = with_image_size(wrap(make(kind, attn_implementation="eager"), name=kind), side)
        with torch.no_grad():
            ref = eager(x, output_attentions=True).attentions
        for i, a in enumerate(ref):
            torch.testing.assert_close(rec[f"blocks.{i}.attn.pattern"], a.float(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", CNN_KINDS + TINY_CNNS)
def test_cnn_contract(kind):
    b = _backbone(kind)
    assert b.spec.kind == "cnn" and b.spec.num_heads == 0
    x = _pixels(b)
    with torch.no_grad(), b.record(["embed", "stages.*", "features"]) as rec:
        out = b(x)
        f = b.final_norm(b.run_blocks(b.embed(x)))
    assert tuple(rec["features"].shape[-2:]) == b.spec.grid
    assert rec["features"].shape[1] == b.spec.embed_dim
    torch.testing.assert_close(f, rec["features"], atol=1e-5, rtol=0)
    if b.spec.has_head:
        torch.testing.assert_close(b.head(f), main_output(out), atol=1e-5, rtol=0)
    with pytest.raises(UnknownHookError, match="CNN"):
        with b.record("blocks.0.attn.pattern"):
            pass


def test_every_registered_family_has_a_test_factory() -> None:
    """A new Hugging Face family is one descriptor file plus one factory: both must exist."""
    from helpers.hf_factories import FACTORIES
    from vitscope.models.families import hf_families
    from vitscope.models.family import family_of

    covered = set()
    for kind in FACTORIES:
        config = make(kind).config
        covered.add(family_of(getattr(config, "vision_config", config)))
    assert covered == set(hf_families()), f"families without a factory: {set(hf_families()) - covered}"
    for name, family in hf_families().items():
        assert family.name == name and family.kind in ("transformer", "cnn")
        assert all(alias.family == name for alias in family.aliases)


def factories_left_out(module: types.ModuleType, factories: dict) -> list[str]:
    """``"kind (test)"`` for every test factory that a contract test of ``module`` run on its peers (factories of
    the same kind of model: transformers or CNNs) does not run, or ``"kind (no test)"`` when no test runs it."""
    runs = {name: set(mark.args[1]) for name, test in vars(module).items() if name.startswith("test_")
            for mark in getattr(test, "pytestmark", []) if mark.name == "parametrize" and mark.args[0] == "kind"}
    left_out = []
    for kind, (cnn, _) in factories.items():
        peers = {k for k, (c, _) in factories.items() if c == cnn}
        tests = [name for name, kinds_run in runs.items() if kinds_run & peers]
        left_out += [f"{kind} ({name})" for name in tests if kind not in runs[name]]
        if not tests:
            left_out.append(f"{kind} (no test)")
    return left_out


def test_every_test_factory_runs_through_the_contract() -> None:
    from helpers.hf_factories import FACTORIES

    assert not factories_left_out(sys.modules[__name__], FACTORIES)


APPENDED = '''

@factory("appended-vit")
def _appended_vit(kw: dict) -> torch.nn.Module:
    return tf.ViTModel(tf.ViTConfig(**SMALL, **kw), add_pooling_layer=False)


@factory("appended-cnn", cnn=True)
def _appended_cnn(kw: dict) -> torch.nn.Module:
    return tf.ResNetModel(tf.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1]))
'''


def test_a_factory_added_at_the_end_of_the_factories_file_is_run(monkeypatch) -> None:
    """The contract tests run a factory wherever it sits in tests/helpers/hf_factories.py: this file, collected
    against the factories file with two factories appended at its end, runs both."""
    import helpers.hf_factories as factories

    appended = types.ModuleType(factories.__name__)
    appended.__file__ = factories.__file__
    exec(compile(Path(factories.__file__).read_text() + APPENDED, factories.__file__, "exec"), appended.__dict__)
    assert {"appended-vit", "appended-cnn"} <= set(appended.FACTORIES)
    monkeypatch.setitem(sys.modules, factories.__name__, appended)
    spec = importlib.util.spec_from_file_location("_adapter_contract_appended", __file__)
    collected = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(collected)
    assert not factories_left_out(collected, appended.FACTORIES)
    left_out = factories_left_out(collected, {**appended.FACTORIES, "unrun": (False, None)})  # the check can fail
    assert "unrun (test_hf_patterns_equal_eager_attention)" in left_out
    assert all(entry.startswith("unrun (test_") for entry in left_out)
