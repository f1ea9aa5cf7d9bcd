"""The attribution methods: one function each, ``(backbone, pixels, score, **options) -> map``.

Token methods return ``[B, gh, gw]`` on the token grid: the row of the token the score reads to the spatial
tokens, prefix columns (CLS, distillation, registers) dropped. That is the CLS row when the output is read from
the CLS token; the mean of the spatial tokens' rows when it is their mean (a classifier that mean-pools, as
BEiT's and timm's ``global_pool="avg"``; an embedding pooled by ``"mean"``; a model without a CLS token); and the
mean of the rows of each part it reads when it reads several (DINOv2's classifier: the CLS token and the patch
mean; DeiT's distilled one: the CLS and distillation tokens). Which tokens a classifier reads is found from its
head: the tokens whose gradient is not zero. Pixel methods return ``[B, H, W]``, the attribution summed over
colour channels, signed. Maps are raw: never normalised.

Attention gradients are exact under the model's own fused kernel: the patterns are those that multiply the values
in vitscope's kernel (an identity edit of ``attn.pattern`` routes every block through it), so ``d score / d A``
is the gradient an eager model would give (tested to 1e-5 against eager attention and autograd).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import torch

from vitscope.errors import VitscopeValueError
from vitscope.functional.rollout import rollout as attention_rollout
from vitscope.models.backbone import Backbone
from vitscope.models.outputs import embedding_hook, embedding_pooling, logits_of, tokens_the_head_reads

__all__ = ["METHODS", "TOKEN_METHODS"]

Score = Callable[[torch.Tensor], torch.Tensor]
ALL_PATTERNS = "blocks.*.attn.pattern"


def _same(t: torch.Tensor, name: str) -> torch.Tensor:
    return t


def _forward(backbone: Backbone, pixels: torch.Tensor, score: Score, names: list[str],
             edits: dict | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(score [B], {name: recorded tensor, in the graph})`` of one forward with gradients."""
    spec = backbone.spec
    tokens = getattr(score, "reads", None) is not None or not spec.has_head  # an embedding's score reads tokens
    source = embedding_hook(spec)
    wanted = list(dict.fromkeys(names + ([source] if tokens else [])))
    if not pixels.requires_grad:  # a frozen model (no parameter needs a gradient) still builds the graph
        pixels = pixels.detach().requires_grad_(True)
    with backbone.intervene(edits or {}), backbone.record(wanted, detach=False) as rec:
        out = backbone(pixels)
        value = score(rec[source] if tokens else logits_of(out))
        return value, dict(rec)


def _reads(backbone: Backbone, pixels: torch.Tensor, score: Score) -> list[str]:
    """The parts of the last tokens the score reads: ``"cls"``, ``"dist"`` (a prefix token each) and ``"mean"``
    (the spatial tokens). An embedding's score says it (its pooling); a classifier's head is asked: the tokens
    whose gradient through the head is not zero (random tokens, no parameter's gradient kept)."""
    named = getattr(score, "reads", None)
    if named is not None:
        return ["cls" if named == "cls" else "mean"]
    spec = backbone.spec
    if not spec.has_head:
        return ["cls" if embedding_pooling(spec) == "cls" else "mean"]
    n = spec.num_prefix_tokens + int(torch.tensor(spec.grid_for(*pixels.shape[-2:])).prod())
    dtype = next(backbone.model.parameters()).dtype
    generator = torch.Generator(device=pixels.device).manual_seed(0)
    probe = torch.randn(1, n, spec.embed_dim, device=pixels.device, generator=generator).to(dtype)
    read = tokens_the_head_reads(backbone, probe)
    kinds = tuple(spec.prefix_kinds)
    parts = [kind for i, kind in enumerate(kinds[:2]) if kind in ("cls", "dist") and bool(read[i])]
    if bool(read[spec.num_prefix_tokens:].any()):
        parts.append("mean")
    return parts or ["cls" if embedding_pooling(spec) == "cls" else "mean"]


def _row(r: torch.Tensor, backbone: Backbone, pixels: torch.Tensor, score: Score) -> torch.Tensor:
    """``[B, N, N]`` -> ``[B, gh, gw]``: the row of the token(s) the score reads over the spatial tokens (the
    mean of the rows of each part it reads)."""
    spec = backbone.spec
    p = spec.num_prefix_tokens
    index = {kind: i for i, kind in enumerate(spec.prefix_kinds)}
    rows = [r[:, p:, p:].mean(dim=1) if part == "mean" else r[:, index[part], p:]
            for part in _reads(backbone, pixels, score)]
    return torch.stack(rows).mean(dim=0).reshape(-1, *spec.grid_for(*pixels.shape[-2:]))


def _patterns(rec: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    return [rec[k] for k in sorted((k for k in rec if k.endswith(".attn.pattern")), key=lambda k: int(k.split(".")[1]))]


def attention(backbone: Backbone, pixels: torch.Tensor, score: Score) -> torch.Tensor:
    """The last block's pattern, mean over heads, the read token's row to the spatial tokens (not renormalised)."""
    last = f"blocks.{backbone.spec.num_blocks - 1}.attn.pattern"
    with torch.no_grad():  # the score is computed too: a target the model cannot give is refused, as by the others
        _, rec = _forward(backbone, pixels, score, [last])
    return _row(rec[last].float().mean(dim=1), backbone, pixels, score)


def rollout(backbone: Backbone, pixels: torch.Tensor, score: Score, discard_ratio: float = 0.0) -> torch.Tensor:
    """Attention rollout (mean over heads, identity added, rows rescaled), the read token's row to the spatial
    tokens."""
    with torch.no_grad():  # the score is computed too, as in attention()
        _, rec = _forward(backbone, pixels, score, [ALL_PATTERNS])
    return _row(attention_rollout(_patterns(rec), "mean", discard_ratio), backbone, pixels, score)


def chefer(backbone: Backbone, pixels: torch.Tensor, score: Score) -> torch.Tensor:
    """Chefer et al. 2021 (generic attention-model explainability, self-attention rule): ``R = I``; per block in
    order ``A_bar = mean_heads((d score / d A) * A)^+``, ``R = R + A_bar R``; the map is R's row of the token the
    score reads (the CLS token in the paper)."""
    value, rec = _forward(backbone, pixels, score, [ALL_PATTERNS], {ALL_PATTERNS: _same})
    patterns = _patterns(rec)
    grads = torch.autograd.grad(value.sum(), patterns)
    b, _, n, _ = patterns[0].shape
    r = torch.eye(n, device=patterns[0].device).expand(b, n, n).clone()
    for a, g in zip(patterns, grads):
        cam = (g * a).clamp(min=0).mean(dim=1).detach()
        r = r + cam @ r
    return _row(r, backbone, pixels, score)


def token_gradcam(backbone: Backbone, pixels: torch.Tensor, score: Score, hook: str | None = None) -> torch.Tensor:
    """Grad-CAM on tokens at ``hook`` (default the last block's ``norm1``): channel weights = the gradient's mean
    over the spatial tokens; map = ReLU(sum over channels of weight x activation)."""
    spec = backbone.spec
    hook = hook or f"blocks.{spec.num_blocks - 1}.norm1"
    value, rec = _forward(backbone, pixels, score, [hook])
    act = rec[hook]
    if act.dim() != 3:
        raise VitscopeValueError(f"token_gradcam reads tokens [B, N, D]; '{hook}' has shape {tuple(act.shape)}")
    (grad,) = torch.autograd.grad(value.sum(), act)
    p = spec.num_prefix_tokens
    weights = grad[:, p:].mean(dim=1, keepdim=True)
    cam = torch.relu((weights * act[:, p:]).sum(dim=-1)).detach()
    return cam.reshape(-1, *spec.grid_for(*pixels.shape[-2:]))


def input_x_gradient(backbone: Backbone, pixels: torch.Tensor, score: Score) -> torch.Tensor:
    """``sum over channels of pixels x d score / d pixels``: ``[B, H, W]``."""
    x = pixels.detach().clone().requires_grad_(True)
    value, _ = _forward(backbone, x, score, [])
    (grad,) = torch.autograd.grad(value.sum(), x)
    return (grad * x).sum(dim=1).detach()


def integrated_gradients(backbone: Backbone, pixels: torch.Tensor, score: Score, baseline: Any = 0.0,
                         steps: int = 32) -> torch.Tensor:
    """Integrated gradients (captum, its default Gauss-Legendre rule) from ``baseline`` (a float, ``[3, H, W]`` or
    ``[B, 3, H, W]`` in the model's normalised input space), ``steps`` points; summed over channels."""
    from captum.attr import IntegratedGradients

    if int(steps) < 1:
        raise VitscopeValueError(f"steps must be at least 1, got {steps}")
    base = _baseline(baseline, pixels)

    def forward(x: torch.Tensor) -> torch.Tensor:
        return _forward(backbone, x, score_for(x), [])[0]

    def score_for(x: torch.Tensor) -> Score:  # captum runs the images several times in one batch
        reps = x.shape[0] // pixels.shape[0]

        def repeated(out: torch.Tensor) -> torch.Tensor:
            return _repeated(score, out, reps)
        repeated.reads = getattr(score, "reads", None)  # type: ignore[attr-defined]
        return repeated

    ig = IntegratedGradients(forward)
    attributions = ig.attribute(pixels.detach(), baselines=base, n_steps=int(steps), method="gausslegendre")
    return attributions.sum(dim=1).detach()


def _baseline(baseline: Any, pixels: torch.Tensor) -> torch.Tensor:
    """Integrated gradients' baseline as ``pixels``' shape ``[B, 3, H, W]``: a number, or a tensor ``[]``,
    ``[3, H, W]``, ``[1, 3, H, W]`` or ``[B, 3, H, W]``; anything else refused in one line."""
    if isinstance(baseline, numbers.Real) and not isinstance(baseline, bool):
        return torch.full_like(pixels, float(baseline))
    one = tuple(pixels.shape[1:])
    if not isinstance(baseline, torch.Tensor) or tuple(baseline.shape) not in ((), one, (1, *one), tuple(pixels.shape)):
        raise VitscopeValueError(f"baseline must be a number or a tensor [3, H, W] or [B, 3, H, W] matching the "
                                 f"pixels {tuple(pixels.shape)}, got {_described(baseline)}")
    return baseline.to(pixels.device, pixels.dtype).expand_as(pixels)


def _described(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _repeated(score: Score, out: torch.Tensor, reps: int) -> torch.Tensor:
    """``score`` of a batch that holds the images ``reps`` times over (captum's steps), image by image."""
    if reps == 1:
        return score(out)
    b = out.shape[0] // reps
    return torch.cat([score(out[i * b:(i + 1) * b]) for i in range(reps)])


def gradcam(backbone: Backbone, pixels: torch.Tensor, score: Score, stage: int | None = None) -> torch.Tensor:
    """Grad-CAM of a CNN at stage ``stage`` (default the last): ReLU of the channels weighted by their gradient's
    spatial mean; ``[B, h, w]`` on that stage's map."""
    spec = backbone.spec
    index = spec.num_blocks - 1 if stage is None else int(stage)
    if not 0 <= index < spec.num_blocks:
        raise VitscopeValueError(f"stage {stage} does not exist: {spec.name} has {spec.num_blocks} stages")
    name = f"stages.{index}"
    value, rec = _forward(backbone, pixels, score, [name])
    (grad,) = torch.autograd.grad(value.sum(), rec[name])
    weights = grad.mean(dim=(2, 3), keepdim=True)
    return torch.relu((weights * rec[name]).sum(dim=1)).detach()


#: method -> (function, the models it runs on: "transformer", "cnn" or "any")
METHODS: dict[str, tuple[Callable[..., torch.Tensor], str]] = {
    "attention": (attention, "transformer"),
    "rollout": (rollout, "transformer"),
    "chefer": (chefer, "transformer"),
    "token_gradcam": (token_gradcam, "transformer"),
    "input_x_gradient": (input_x_gradient, "any"),
    "integrated_gradients": (integrated_gradients, "any"),
    "gradcam": (gradcam, "cnn"),
}
#: the methods whose maps are on the token grid (the others: pixels, or a CNN's map)
TOKEN_METHODS: frozenset[str] = frozenset({"attention", "rollout", "chefer", "token_gradcam"})
