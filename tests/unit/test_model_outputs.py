"""How an edit's output change is read (vitscope.models.outputs.output_change): the KL divergence by hand, and at
the size of float32 rounding, where only a float64 sum reads it."""

from __future__ import annotations

import math
import types

import pytest
import torch

from vitscope.models.outputs import output_change

_CLASSIFIER = types.SimpleNamespace(spec=types.SimpleNamespace(has_head=True, classifies=True))


def test_the_kl_divergence_of_two_class_distributions_by_hand() -> None:
    """p = (1/2, 1/2), q = (1/4, 3/4): KL(p || q) = (ln 2 + ln 2/3) / 2 = ln(4/3) / 2; the top class changes."""
    clean, edited = torch.tensor([[0.0, 0.0]]), torch.tensor([[0.0, math.log(3.0)]])
    change = output_change(_CLASSIFIER, clean, edited)
    assert change["output_kl"] == pytest.approx(math.log(4 / 3) / 2, rel=1e-6) and change["top1_kept"] == 0.0
    assert output_change(_CLASSIFIER, clean, clean)["output_kl"] == 0.0


@pytest.mark.parametrize("seed", range(6))
def test_a_change_at_float32_rounding_reads_its_kl_divergence_not_the_sums_noise(seed: int) -> None:
    """Logits moved by d ~ 1e-5 (a control that puts back nearly the same tokens): to second order KL(p || q) =
    (E_p[d^2] - E_p[d]^2) / 2, about 1e-11 here, far below a float32 sum's rounding of p (p - q) (about 1e-8,
    of either sign). The reading must match it and never be negative."""
    gen = torch.Generator().manual_seed(seed)
    clean = 5 * torch.randn(4, 1000, generator=gen)
    edited = clean + 1e-5 * torch.randn(4, 1000, generator=gen)
    d, p = (edited - clean).double(), clean.double().softmax(dim=-1)
    second_order = float((((p * d**2).sum(-1) - (p * d).sum(-1) ** 2) / 2).mean())
    kl = output_change(_CLASSIFIER, clean, edited)["output_kl"]
    assert kl >= 0.0 and kl == pytest.approx(second_order, rel=1e-3)
    ulp = torch.nextafter(clean, torch.full_like(clean, math.inf))  # one float32 step up: KL about 1e-14
    assert 0.0 <= output_change(_CLASSIFIER, clean, ulp)["output_kl"] < 1e-12
