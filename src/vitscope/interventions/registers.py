"""Test-time registers (Jiang et al. 2025, "Vision Transformers Don't Need Trained Registers"): an extra token added
at inference, and the activations of the register neurons (the MLP units that write the high-norm outliers) moved
onto it from the patch tokens.

Following the authors' code (``shared/hook_fn.py::activate_on_registers``): the register starts as a zero vector
without position embedding; at each chosen block the chosen units' activations on the patch tokens are set to zero and
the register gets, for every chosen unit, the value of largest magnitude (with its sign) over all tokens and chosen
units of that image; the CLS token is left alone. With additive position embeddings the place of a token in the
sequence does not change what attention computes, so the register goes after the model's own prefix tokens (where
trained registers sit) instead of after the patches: every analysis then reads it as one more register (with
rotary position embeddings on the patches, as DINOv3's, it is also the place that keeps the patches' rotations).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from vitscope.errors import VitscopeValueError
from vitscope.hooks.edits import EditSet
from vitscope.models.backbone import Backbone

__all__ = ["register_neuron_edits", "test_time_register", "with_test_time_register"]


#: families whose attention depends on where a token sits (a relative position bias sized for the model's tokens)
_POSITIONAL_FAMILIES = ("beit",)


def with_test_time_register(backbone: Backbone) -> Backbone:
    """A copy of ``backbone`` with one more register token: zero, without position embedding, after its prefix
    tokens (spec: one more prefix token of kind ``"reg"``, name ``<name>+ttr``). A timm-layout ViT gets it as one
    more ``reg_token`` (or, when its position embeddings cover its prefix tokens, from a hook after them); a Hugging
    Face model from a hook on its embeddings (after their position embeddings).

    Raises:
        ValueError: a CNN, or a family whose attention depends on the token's place (BEiT's relative position
            bias).
    """
    spec = backbone.spec
    model = backbone.model
    embeddings = getattr(getattr(backbone, "base", None), "embeddings", None)
    timm = hasattr(model, "reg_token") and hasattr(model, "num_prefix_tokens")
    if not spec.is_transformer or (not timm and embeddings is None):
        raise VitscopeValueError(f"a test-time register needs a ViT (a reg_token, or Hugging Face embeddings); "
                                 f"{spec.name} ({type(model).__name__}) has neither")
    if spec.family.startswith(_POSITIONAL_FAMILIES):
        raise VitscopeValueError(f"{spec.name} ({spec.family}) adds a relative position bias sized for its own tokens: "
                                 "one more token does not fit it")
    if timm and getattr(model, "no_embed_class", True) is False and not isinstance(getattr(model, "pos_drop", None),
                                                                                  nn.Module):
        raise VitscopeValueError(f"{spec.name}: its position embeddings cover its prefix tokens (no_embed_class=False) "
                                 "and it has no pos_drop module after them to put a register at")
    out = copy.deepcopy(backbone)
    if timm and getattr(out.model, "no_embed_class", True) is False:
        _PrefixAfterPositions(out.model).install()
    elif timm:
        m = out.model
        zero = torch.zeros(1, 1, m.pos_embed.shape[-1], dtype=m.pos_embed.dtype, device=m.pos_embed.device)
        m.reg_token = nn.Parameter(zero if m.reg_token is None else torch.cat([m.reg_token.data, zero], dim=1),
                                   requires_grad=False)
        m.num_prefix_tokens = int(m.num_prefix_tokens) + 1
    else:
        out.base.embeddings.register_forward_hook(_inserting(spec.num_prefix_tokens))
    out.spec = dataclasses.replace(spec, name=f"{spec.name}+ttr", num_prefix_tokens=spec.num_prefix_tokens + 1,
                                   prefix_kinds=(*spec.prefix_kinds, "reg"))
    try:  # what else reads the number of tokens (an attention mask of the patches, a pooling head) says so here
        with torch.no_grad():
            out(torch.zeros(1, 3, *spec.image_size, device=out.device))
    except RuntimeError as err:
        raise VitscopeValueError(f"{spec.name} cannot take one more token ({str(err).splitlines()[0]})") from None
    if not timm and spec.has_head:
        _refuse_a_head_that_pools_the_register(out)
    return out


def _refuse_a_head_that_pools_the_register(registered: Backbone) -> None:
    """A Hugging Face classifier counts its prefix tokens from its config: one that pools the patches (DINOv2's
    patch mean, I-JEPA's mean of every token) takes the register in, so the outliers moved onto it would reach
    the logits; refused (the model's own logits differ from the head's without the register, or the head reads it).
    """
    from vitscope.models.outputs import head_logits, logits_of, tokens_the_head_reads

    spec = registered.spec
    last = f"blocks.{spec.num_blocks - 1}.resid_post"
    x = torch.randn(2, 3, *spec.image_size, generator=torch.Generator().manual_seed(0)).to(registered.device)
    with torch.no_grad(), registered.record(last) as rec:
        own = logits_of(registered(x)).float()
        tokens = rec[last].clone()
        ours = head_logits(registered, tokens).float()
    reads_register = bool(tokens_the_head_reads(registered, tokens)[spec.num_prefix_tokens - 1])
    if reads_register or not torch.allclose(own, ours, rtol=1e-4, atol=1e-5 * float(own.abs().max().clamp_min(1.0))):
        raise VitscopeValueError(f"{spec.name.removesuffix('+ttr')}'s classifier pools the patch tokens, so it would "
                                 "take a test-time register in; load the model without its classifier (an embedding "
                                 "model) for a test-time register")


class _PrefixAfterPositions:
    """A zero register for a timm ViT whose position embeddings cover its prefix tokens (``no_embed_class=False``:
    timm's original ViT, DeiT): a ``reg_token`` would need a position embedding of its own, so the register is put
    at the output of ``pos_drop``, after the position embeddings. The model counts its prefix tokens without the
    register while it embeds (a dynamic input size resamples the position embeddings by that count) and with it
    from then on (pooling skips it). Bound methods as hooks: a deep copy of the model gets hooks of its own."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.at = int(model.num_prefix_tokens)

    def install(self) -> None:
        self.model.patch_embed.register_forward_pre_hook(self.embedding)
        self.model.pos_drop.register_forward_hook(self.embedded)
        self.model.num_prefix_tokens = self.at + 1

    def embedding(self, module: nn.Module, args: tuple) -> None:
        self.model.num_prefix_tokens = self.at

    def embedded(self, module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        self.model.num_prefix_tokens = self.at + 1
        return _inserting(self.at)(module, args, output)


def _inserting(at: int):
    """A forward hook of an embeddings module putting a zero token at position ``at`` of its output."""
    def hook(module: nn.Module, args: tuple, output: Any) -> Any:
        tokens = output[0] if isinstance(output, tuple) else output
        zero = tokens.new_zeros(tokens.shape[0], 1, tokens.shape[2])
        tokens = torch.cat([tokens[:, :at], zero, tokens[:, at:]], dim=1)
        return (tokens, *output[1:]) if isinstance(output, tuple) else tokens
    return hook


def _sign_max(values: torch.Tensor) -> torch.Tensor:
    """``[B, ...]`` -> ``[B]``: the entry of largest magnitude of every image, with its sign."""
    flat = values.flatten(1)
    high, low = flat.amax(dim=1), flat.amin(dim=1)
    return torch.where(high.abs() >= low.abs(), high, low)


def register_neuron_edits(neurons: Mapping[int, Sequence[int]], register: int, num_prefix: int,
                          scale: float = 1.0) -> EditSet:
    """Edits of ``blocks.{i}.mlp.post`` that move the activations of ``neurons`` onto the token ``register``.

    Args:
        neurons: block -> the MLP units (register neurons) to move in it.
        register: the register token's position; num_prefix: prefix tokens (patches come after them).
        scale: the register's value as a multiple of the sign-max activation (the authors' ``scale``).
    """
    edits = EditSet()
    for block, units in neurons.items():
        chosen = sorted({int(u) for u in units})
        if not chosen:
            continue

        def edit(t: torch.Tensor, name: str, _units: list[int] = chosen) -> torch.Tensor:
            if max(_units) >= t.shape[-1]:
                raise VitscopeValueError(f"{name} has {t.shape[-1]} units; register neurons {_units} do not exist")
            index = torch.tensor(_units, device=t.device)
            value = _sign_max(t.index_select(-1, index))  # [B], over every token and chosen unit
            out = t.clone()
            out[:, num_prefix:, index] = 0.0
            out[:, register, index] = (scale * value)[:, None].to(t.dtype)
            return out
        edits[f"blocks.{int(block)}.mlp.post"] = edit
    return edits


def test_time_register(backbone: Backbone, neurons: Mapping[int, Sequence[int]], scale: float = 1.0
                       ) -> tuple[Backbone, EditSet]:
    """A copy of ``backbone`` with a test-time register, and the edits that move the register neurons onto it::

        registered, edits = test_time_register(backbone, {2: [0]})
        with registered.intervene(edits):
            results = vitscope.run(registered, data, ["artifacts"])

    Args:
        backbone: a ViT (:func:`with_test_time_register`).
        neurons: block -> register neurons (e.g. the ``register_neurons`` the artifacts analysis ranks first).
        scale: see :func:`register_neuron_edits`.
    """
    registered = with_test_time_register(backbone)
    p = registered.spec.num_prefix_tokens
    return registered, register_neuron_edits(neurons, register=p - 1, num_prefix=p, scale=scale)
