"""Recording semantics: only what was asked, patterns, unknown names, clean-up, latest forward, bf16, tokens."""

from __future__ import annotations

import pytest
import torch

import vitscope
from helpers.hf_factories import make
from vitscope.hooks.names import UnknownHookError


@pytest.fixture(scope="module")
def tiny():
    return vitscope.load_model("tiny-vit")


def test_only_requested_names_are_recorded(tiny):
    with torch.no_grad(), tiny.record(["blocks.*.attn.pattern", "blocks.3.resid_post"]) as rec:
        tiny(torch.randn(1, 3, 64, 64))
    assert sorted(rec) == sorted([f"blocks.{i}.attn.pattern" for i in range(6)] + ["blocks.3.resid_post"])
    with pytest.raises(UnknownHookError, match="not requested"):
        rec["blocks.2.resid_post"]


def test_unknown_name_lists_valid_sites(tiny):
    with pytest.raises(UnknownHookError) as err:
        with tiny.record(["blocks.3.resid_psot"]):
            pass
    assert "blocks.3.resid_post" in str(err.value) and "attn.pattern" in str(err.value)
    with pytest.raises(UnknownHookError):
        with tiny.record(["blocks.99.resid_post"]):
            pass


def test_hooks_removed_on_exit_and_on_exception(tiny):
    def count():
        return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in tiny.model.modules())

    before = count()
    with pytest.raises(RuntimeError, match="boom"):
        with tiny.record("blocks.*"):
            assert count() > before
            raise RuntimeError("boom")
    assert count() == before


def test_hf_kernel_restored_after_exception_inside_forward():
    b = vitscope.wrap(make("vit"))
    o_proj = b.layers[1].attention.o_proj

    def boom(m, a):
        raise RuntimeError("boom inside attention")

    handle = o_proj.register_forward_pre_hook(boom)  # fires after the kernel was switched
    try:
        with pytest.raises(RuntimeError, match="boom"):
            with b.record("blocks.*.attn.pattern"):
                b(torch.randn(1, 3, 32, 32))
    finally:
        handle.remove()
    assert b.model.config._attn_implementation == "sdpa"
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in b.model.modules()) == 0


def test_each_name_holds_the_latest_forward(tiny):
    x1, x2 = torch.randn(1, 3, 64, 64), torch.randn(1, 3, 64, 64)
    with torch.no_grad(), tiny.record("blocks.0.resid_post") as rec:
        tiny(x1)
        first = rec["blocks.0.resid_post"].clone()
        tiny(x2)
        second = rec["blocks.0.resid_post"]
    assert not torch.equal(first, second)
    with torch.no_grad(), tiny.record("blocks.0.resid_post") as rec2:
        tiny(x2)
    assert torch.equal(second, rec2["blocks.0.resid_post"])


def test_recorded_tensors_can_carry_gradients(tiny):
    x = torch.randn(1, 3, 64, 64, requires_grad=True)
    with tiny.record("blocks.2.mlp.post", detach=False) as rec:
        tiny(x)
        rec["blocks.2.mlp.post"][..., 5].mean().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


@pytest.mark.parametrize("kind", ["vit", "beit", "tiny-vit"])
def test_bf16_autocast_patterns_are_float32_and_close(kind):
    b = vitscope.load_model(kind) if kind.startswith("tiny") else vitscope.wrap(make(kind))
    x = torch.randn(2, 3, *b.spec.image_size)
    with torch.no_grad(), b.record("blocks.*.attn.pattern") as rec:
        b(x)
        ref = {k: v.clone() for k, v in rec.items()}
        with torch.autocast("cpu", dtype=torch.bfloat16):
            b(x)
    for name, p in rec.items():
        assert p.dtype == torch.float32
        torch.testing.assert_close(p, ref[name], atol=1e-2, rtol=0)


def test_tokens_to_grid_non_square_and_larger_inputs(tiny):
    x = torch.randn(1, 3, 64, 96)  # larger than training size, non-square: 8 x 12 grid
    with torch.no_grad(), tiny.record("final_norm") as rec:
        tiny(x)
    tokens = rec["final_norm"]
    assert tokens.shape[1] == 1 + 8 * 12
    fmap = vitscope.tokens_to_grid(tokens, (8, 12), 1)
    assert fmap.shape == (1, 128, 8, 12)
    torch.testing.assert_close(fmap[0, :, 2, 7], tokens[0, 1 + 2 * 12 + 7])
    hf = vitscope.wrap(make("dinov2-reg"))
    with torch.no_grad(), hf.record("blocks.0.attn.pattern") as rec:
        hf(torch.randn(1, 3, 48, 32))  # 6 x 4 grid, interpolated position embeddings
    assert rec["blocks.0.attn.pattern"].shape[-1] == 4 + 6 * 4
    with pytest.raises(ValueError, match="grid"):
        vitscope.tokens_to_grid(tokens, (8, 11), 1)
