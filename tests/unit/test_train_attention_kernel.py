"""LoopConfig.math_attention: explicit attention while training, the same losses, switches restored after."""

import pytest
import torch
import torch.nn.functional as F

from vitscope.models.tiny import explicit_attention
from vitscope.models.wrap import build_tiny_vit
from vitscope.train.data import TensorImages, synthetic_split
from vitscope.train.loop import LoopConfig, fit
from vitscope.train.self_distill import SelfDistillConfig, SelfDistillRecipe
from vitscope.train.supervised import SupervisedConfig, SupervisedRecipe


@pytest.fixture(scope="module")
def data() -> TensorImages:
    return synthetic_split(32, seed=7, size=32)


def _vit(**kw):
    return build_tiny_vit("t", image_size=32, depth=2, embed_dim=32, num_heads=2, **kw)


def _switches(recipe) -> list[bool]:
    return [m.fused_attn for root in recipe.modules().values() for m in root.modules() if hasattr(m, "fused_attn")]


def _record_switches(recipe, fail_at: int | None = None) -> list[list[bool]]:
    """Wrap ``recipe.loss`` to record the attention switches at every call; raise on step ``fail_at``."""
    seen: list[list[bool]] = []
    original = recipe.loss

    def loss(images, labels, step, gen, **kw):
        seen.append(_switches(recipe))
        if step == fail_at:
            raise RuntimeError("boom")
        return original(images, labels, step, gen, **kw)

    recipe.loss = loss
    return seen


def _run(data, math: bool) -> tuple[SupervisedRecipe, list[list[bool]], list[float]]:
    recipe = SupervisedRecipe(_vit(num_classes=10), SupervisedConfig(warmup=1))
    seen = _record_switches(recipe)
    result = fit(recipe, data, LoopConfig(steps=3, batch_size=8, seed=1, progress=False, math_attention=math))
    return recipe, seen, result.losses


def test_math_attention_switches_off_the_fused_kernel_only_while_training(data):
    recipe, seen, _ = _run(data, math=True)
    assert seen and all(s == [False, False] for s in seen)
    assert _switches(recipe) == [True, True]
    _, plain, _ = _run(data, math=False)
    assert all(s == [True, True] for s in plain)


def test_math_attention_gives_the_fused_kernels_losses(data):
    *_, fused = _run(data, math=False)
    *_, math = _run(data, math=True)
    assert math == pytest.approx(fused, rel=1e-4)


def test_switches_are_restored_when_training_fails(data):
    recipe = SupervisedRecipe(_vit(num_classes=10), SupervisedConfig(warmup=1))
    seen = _record_switches(recipe, fail_at=1)
    with pytest.raises(RuntimeError, match="boom"):
        fit(recipe, data, LoopConfig(steps=3, batch_size=8, progress=False, math_attention=True))
    assert seen[-1] == [False, False] and _switches(recipe) == [True, True]


def test_self_distillation_switches_student_and_teacher(data):
    recipe = SelfDistillRecipe(_vit(num_classes=0), SelfDistillConfig(out_dim=16, hidden_dim=16, bottleneck_dim=8,
                                                                       local_crops=1, local_size=16))
    seen = _record_switches(recipe)
    fit(recipe, data, LoopConfig(steps=2, batch_size=8, progress=False, math_attention=True))
    assert len(seen[0]) == 4 and not any(seen[0])  # two blocks each in the student and in the teacher
    assert all(_switches(recipe))


def test_explicit_attention_under_bf16_autocast_is_as_accurate_as_the_fused_kernel():
    """Logits and softmax stay float32; in bfloat16 the error would be about twice the fused kernel's."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(16, 4, 65, 32) * 2 for _ in range(3))
    reference = explicit_attention(q, k, v, 32 ** -0.5)
    assert torch.allclose(reference, F.scaled_dot_product_attention(q, k, v), atol=1e-5)
    q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = F.scaled_dot_product_attention(q, k, v)
        explicit = explicit_attention(q, k, v, 32 ** -0.5)
    assert explicit.dtype == torch.bfloat16
    fused_error = (fused.float() - reference).abs().mean()
    assert (explicit.float() - reference).abs().mean() <= 1.2 * fused_error
