"""Hand-computed cases for attention statistics and MeanActivation."""

from __future__ import annotations

import math

import pytest
import torch

from vitscope.analyses import AttentionStats, Batch, MeanActivation
from vitscope.functional.attention_stats import attention_entropy, max_attention
from vitscope.models.spec import ModelSpec


def _spec(kind: str = "transformer") -> ModelSpec:
    if kind == "cnn":
        return ModelSpec(name="cnn", family="resnet", kind="cnn", num_blocks=2, num_heads=0, embed_dim=3,
                         mlp_dim=0, patch_size=4, grid=(2, 3), num_prefix_tokens=0, prefix_kinds=(),
                         image_size=(8, 12))
    return ModelSpec(name="vit", family="tiny-vit", kind="transformer", num_blocks=2, num_heads=2, embed_dim=4,
                     mlp_dim=8, patch_size=4, grid=(1, 3), num_prefix_tokens=1, prefix_kinds=("cls",),
                     image_size=(4, 12))


def _batch(size: int, kind: str = "transformer") -> Batch:
    spec = _spec(kind)
    return Batch(pixels=torch.zeros(size, 3, *spec.image_size), indices=list(range(size)),
                 paths=[f"{i}.png" for i in range(size)], spec=spec, grid=spec.grid)


def _uniform(b: int, h: int, n: int) -> torch.Tensor:
    return torch.full((b, h, n, n), 1.0 / n)


def _one_hot(b: int, h: int, n: int) -> torch.Tensor:
    return torch.eye(n).expand(b, h, n, n).clone()


# ---------------------------------------------------------------- functional


def test_uniform_rows_have_entropy_log_n_and_max_one_over_n() -> None:
    p = _uniform(2, 3, 5)
    torch.testing.assert_close(attention_entropy(p), torch.full((2, 3), math.log(5)))
    torch.testing.assert_close(max_attention(p), torch.full((2, 3), 0.2))


def test_one_hot_rows_have_entropy_zero_and_max_one() -> None:
    p = _one_hot(1, 2, 4)
    assert torch.equal(attention_entropy(p), torch.zeros(1, 2))  # 0 * log 0 = 0, no NaN
    assert torch.equal(max_attention(p), torch.ones(1, 2))


def test_two_key_rows_by_hand() -> None:
    p = torch.tensor([[0.25, 0.75], [1.0, 0.0]], dtype=torch.float64).reshape(1, 1, 2, 2)
    row0 = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))  # 0.5623351446...
    assert attention_entropy(p).item() == pytest.approx(row0 / 2, rel=1e-12)
    assert max_attention(p).item() == pytest.approx((0.75 + 1.0) / 2, rel=1e-12)


def test_computation_dtype() -> None:
    p = _uniform(1, 1, 4)
    assert attention_entropy(p.half()).dtype == torch.float32
    assert attention_entropy(p.bfloat16()).dtype == torch.float32
    assert attention_entropy(p.double()).dtype == torch.float64
    assert max_attention(p.half()).dtype == torch.float32
    assert attention_entropy(p, dtype=torch.float64).dtype == torch.float64
    with pytest.raises(ValueError, match="dtype"):
        attention_entropy(p, dtype=torch.float16)
    with pytest.raises(ValueError, match="B, H, N, N"):
        attention_entropy(torch.ones(3))


# ---------------------------------------------------------------- AttentionStats


def test_attention_stats_averages_per_image_values_over_images() -> None:
    n = 4
    acc = AttentionStats()
    first = _uniform(1, 2, n)  # image 0: uniform
    second = torch.cat([_one_hot(1, 2, n), _uniform(1, 2, n)])  # image 1: one-hot, image 2: uniform
    acc.update({f"blocks.{i}.attn.pattern": first for i in range(2)}, _batch(1))
    acc.update({f"blocks.{i}.attn.pattern": second for i in range(2)}, _batch(2))
    result = acc.compute()
    ent = 2 * math.log(n) / 3
    torch.testing.assert_close(result["entropy"], torch.full((2, 2), ent, dtype=torch.float64))
    torch.testing.assert_close(result["entropy_normalised"], torch.full((2, 2), 2 / 3, dtype=torch.float64))
    torch.testing.assert_close(result["max_attention"], torch.full((2, 2), (2 / n + 1) / 3, dtype=torch.float64))
    assert result.meta == {"num_images": 3, "num_tokens": n, "blocks": [0, 1]}


def test_attention_stats_orders_blocks_numerically() -> None:
    acc = AttentionStats()
    record = {f"blocks.{i}.attn.pattern": _uniform(1, 1, 2) * (1.0 if i != 10 else 0.0) for i in (10, 2, 0)}
    record["blocks.2.resid_post"] = torch.zeros(1, 2, 4)  # ignored
    acc.update(record, _batch(1))
    result = acc.compute()
    assert result.meta["blocks"] == [0, 2, 10]
    assert result["max_attention"][:, 0].tolist() == [0.5, 0.5, 0.0]


def test_attention_stats_normalise_each_image_by_its_own_tokens_and_refuse_a_cnn() -> None:
    """Images of 4 and 5 tokens (two grids): uniform attention has entropy log N, so each normalised entropy is 1
    and their mean is 1, where one log N for both would not give 1."""
    acc = AttentionStats()
    acc.update({"blocks.0.attn.pattern": _uniform(1, 2, 4)}, _batch(1))
    acc.update({"blocks.0.attn.pattern": _uniform(1, 2, 5)}, _batch(1))
    result = acc.compute()
    torch.testing.assert_close(result.tensors["entropy"], torch.full((1, 2), (math.log(4) + math.log(5)) / 2,
                                                                     dtype=torch.float64))
    torch.testing.assert_close(result.tensors["entropy_normalised"], torch.ones(1, 2, dtype=torch.float64))
    assert result.meta["tokens"] == {"4": 1, "5": 1}
    with pytest.raises(ValueError, match="attn.pattern"):
        acc.update({"blocks.0.resid_post": torch.zeros(1, 4, 4)}, _batch(1))
    assert not acc.supports(_spec("cnn"))
    assert acc.required_hooks(_spec()) == ["blocks.*.attn.pattern"]


# ---------------------------------------------------------------- MeanActivation


def test_mean_activation_hand_case_and_batching() -> None:
    values = torch.tensor([1.0, 2.0, 3.0, 4.0]).reshape(4, 1, 1)  # 4 images, 1 token, 1 channel
    whole = MeanActivation(hooks=["blocks.0.resid_post"])
    whole.update({"blocks.0.resid_post": values}, _batch(4))
    split = MeanActivation(hooks=["blocks.0.resid_post"])
    split.update({"blocks.0.resid_post": values[:1]}, _batch(1))
    split.update({"blocks.0.resid_post": values[1:]}, _batch(3))
    for acc in (whole, split):
        result = acc.compute()
        assert result["blocks.0.resid_post.mean"].item() == pytest.approx(2.5, rel=1e-15)
        assert result["blocks.0.resid_post.var"].item() == pytest.approx(1.25, rel=1e-15)
        assert result["blocks.0.resid_post.token_norm"].item() == pytest.approx(2.5, rel=1e-15)
        assert result.meta["num_images"] == 4
    unbiased = MeanActivation(hooks=["blocks.0.resid_post"], ddof=1)
    unbiased.update({"blocks.0.resid_post": values}, _batch(4))
    assert unbiased.compute()["blocks.0.resid_post.var"].item() == pytest.approx(5 / 3, rel=1e-15)


def test_mean_activation_per_token_shapes_and_pattern_matching() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 4, 3, generator=gen)
    acc = MeanActivation()  # default blocks.*.resid_post
    acc.update({"blocks.0.resid_post": x, "blocks.1.resid_post": 2 * x, "blocks.0.norm1": x}, _batch(5))
    result = acc.compute()
    assert result.meta["hooks"] == ["blocks.0.resid_post", "blocks.1.resid_post"]
    mean = x.double().mean(0)
    torch.testing.assert_close(result["blocks.0.resid_post.mean"], mean)
    torch.testing.assert_close(result["blocks.0.resid_post.var"], x.double().var(0, unbiased=False))
    torch.testing.assert_close(result["blocks.1.resid_post.token_norm"], (2 * mean).norm(dim=-1))
    assert result["blocks.0.resid_post.token_norm"].shape == (4,)


@pytest.mark.parametrize(("save", "written"), [("norm", set()), ("mean", {"mean"}), ("all", {"mean", "var"})])
def test_mean_activation_save_chooses_what_the_folder_keeps(save: str, written: set[str]) -> None:
    from vitscope.analyses.result import SMALL

    acc = MeanActivation(save=save)
    acc.update({"blocks.0.resid_post": torch.randn(2, SMALL // 8 + 1, 8)}, _batch(2))  # [N, D] over SMALL
    result = acc.compute()
    assert {"blocks.0.resid_post.mean", "blocks.0.resid_post.var"} <= set(result.tensors)  # all in memory
    assert {k.rsplit(".", 1)[-1] for k in result.arrays()} == written
    with pytest.raises(ValueError, match="save must be one of"):
        MeanActivation(save="everything")


def test_mean_activation_cnn_maps_are_tokens() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 2, 3, generator=gen)  # [B, C, h, w]
    acc = MeanActivation()
    assert acc.required_hooks(_spec("cnn")) == ["stages.*"] and acc.supports(_spec("cnn"))
    assert not MeanActivation(hooks=["blocks.*.resid_post"]).supports(_spec("cnn"))
    acc.update({"stages.1": x}, _batch(3, "cnn"))
    mean = acc.compute()["stages.1.mean"]
    assert mean.shape == (6, 5)  # [h*w, C]
    r, c = 1, 2
    torch.testing.assert_close(mean[r * 3 + c], x[:, :, r, c].double().mean(0))


def test_mean_activation_token_mismatch_raises() -> None:
    acc = MeanActivation()
    acc.update({"blocks.0.resid_post": torch.zeros(2, 4, 3)}, _batch(2))
    with pytest.raises(ValueError, match="mismatched tokens"):
        acc.update({"blocks.0.resid_post": torch.zeros(2, 7, 3)}, _batch(2))
    other = MeanActivation()
    other.update({"blocks.0.resid_post": torch.zeros(1, 9, 3)}, _batch(1))
    with pytest.raises(ValueError, match="9 tokens"):
        acc.merge(other)
    with pytest.raises(ValueError, match="record holds none"):
        acc.update({"blocks.0.norm1": torch.zeros(2, 4, 3)}, _batch(2))
    with pytest.raises(ValueError, match=r"\[B, N, D\]"):
        acc.update({"blocks.0.resid_post": torch.zeros(2, 4)}, _batch(2))
