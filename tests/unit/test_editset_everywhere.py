"""Every ready-made edit is an EditSet: ``a | b`` keeps both where they name one hook, whichever module made them."""

from __future__ import annotations

import torch

from vitscope.autoencoders.model import SparseAutoencoder
from vitscope.hooks.edits import EditSet
from vitscope.interventions import ablate_outliers
from vitscope.interventions.registers import register_neuron_edits
from vitscope.sae import ablate_latents, steer_latent


def _applied(edits: dict, name: str, x: torch.Tensor) -> torch.Tensor:
    return edits[name](x.clone(), name)


def test_outlier_ablations_combine_instead_of_replacing() -> None:
    hook = "blocks.1.resid_post"
    x = torch.tensor([[[0.0, 0.0], [3.0, 4.0], [30.0, 40.0]]])  # CLS, a token of norm 5, one of norm 50
    low, high = ablate_outliers(hook, 1.0, 1, "zero"), ablate_outliers(hook, 10.0, 1, "zero")
    both = low | high
    assert isinstance(low, EditSet) and isinstance(both, EditSet)
    assert torch.equal(_applied(both, hook, x), _applied(low, hook, x))  # the lower threshold's edit is kept
    assert not torch.equal(_applied(high | {}, hook, x), _applied(low, hook, x))


def test_sae_and_register_edits_are_edit_sets() -> None:
    sae, hook = SparseAutoencoder(4, 8, k=2), "blocks.0.resid_post"
    steer, ablate = steer_latent(sae, hook, 1, 2.0), ablate_latents(sae, hook, [1], ("cls",))
    assert isinstance(steer, EditSet) and isinstance(ablate, EditSet)
    x = torch.randn(1, 3, 4, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(_applied(steer | ablate, hook, x), _applied(ablate, hook, _applied(steer, hook, x)))
    assert isinstance(register_neuron_edits({0: [1]}, register=1, num_prefix=2), EditSet)
