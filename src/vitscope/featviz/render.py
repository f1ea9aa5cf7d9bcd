"""Activation maximisation with the published recipe of paper 001 (docs/methods.md, Feature visualisation).

Several units are optimised together, one image each, in one batch of ``units * copies`` augmented
images: per-unit losses are independent (separate pixels, per-element Adam, TV averaged per unit),
so the batch only shares the cost of the forward (the random draws are shared too: the same seed
and the same list of objectives give the same images). The forward stops after the deepest block an
objective reads (truncated feature visualisation), and the weights are frozen for the run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import torch

from vitscope.errors import VitscopeRuntimeError, VitscopeTypeError, VitscopeUsageError, VitscopeValueError
from vitscope.featviz.augment import AugmentConfig, augment
from vitscope.featviz.objectives import Objective
from vitscope.functional.total_variation import total_variation
from vitscope.hooks.names import split_block_name
from vitscope.models.backbone import Backbone

__all__ = ["FeatvizConfig", "FeatvizDivergedError", "FeatvizResult", "StagedForward", "StepInfo", "evaluate", "frozen",
           "render"]


class FeatvizDivergedError(VitscopeRuntimeError, FloatingPointError):
    """The optimisation's loss stopped being a finite number (still a ``FloatingPointError`` to catch)."""


@dataclass(frozen=True)
class FeatvizConfig:
    """Optimisation settings (defaults: the published code).

    Attributes:
        steps: optimisation steps (400).
        lr: Adam learning rate at step 0 (0.1), cosine-annealed to 0 (``schedule="cosine"``) or kept.
        betas: Adam betas ((0.5, 0.99)).
        lambda_tv: weight of :func:`~vitscope.functional.total_variation` on the augmented batch (4e-4).
        seed: seed of the initial pixels and of every augmentation draw.
        schedule: ``"cosine"`` or ``"constant"``.
        augment: the augmentation ensemble (8 copies, jitter, ColorShift, annealed noise).
    """

    steps: int = 400
    lr: float = 0.1
    betas: tuple[float, float] = (0.5, 0.99)
    lambda_tv: float = 4e-4
    seed: int = 0
    schedule: str = "cosine"
    augment: AugmentConfig = field(default_factory=AugmentConfig)

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise VitscopeValueError(f"steps must be >= 1, got {self.steps}")
        if self.schedule not in ("cosine", "constant"):
            raise VitscopeValueError(f"schedule must be 'cosine' or 'constant', got {self.schedule!r}")
        # an infinite or NaN weight makes the first loss NaN: refuse it before any model work
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise VitscopeUsageError(f"lr must be a finite number > 0, got {self.lr}")
        if not (math.isfinite(self.lambda_tv) and self.lambda_tv >= 0):
            raise VitscopeUsageError(f"lambda_tv must be a finite number >= 0, got {self.lambda_tv}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class StepInfo:
    """What the callback sees after every step.

    Attributes:
        step: 0-based step just taken; steps: total.
        images: ``[U, 3, H, W]`` current pixels in [0, 1] (detached; do not modify).
        loss: ``[U]`` loss of each unit at this step; activation: ``[U]`` mean objective over its copies.
    """

    step: int
    steps: int
    images: torch.Tensor
    loss: torch.Tensor
    activation: torch.Tensor


@dataclass
class FeatvizResult:
    """Optimised images and their histories.

    Attributes:
        names: readable name of each objective.
        images: ``[U, 3, H, W]`` float32 in [0, 1] on the CPU.
        loss: ``[steps, U]`` loss per step and unit.
        activation: ``[steps, U]`` objective value (mean over the augmented copies) per step and unit.
        config: the settings used.
    """

    names: list[str]
    images: torch.Tensor
    loss: torch.Tensor
    activation: torch.Tensor
    config: FeatvizConfig

    def to_uint8(self) -> torch.Tensor:
        """``[U, H, W, 3]`` uint8 for saving."""
        return (self.images.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1)


@contextmanager
def frozen(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Eval mode and ``requires_grad=False`` on every parameter; both restored on exit, module by module (a model
    being fine-tuned keeps its frozen norms in eval mode)."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    modes = [(m, m.training) for m in model.modules()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        model.eval()
        yield model
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
        for module, training in modes:
            module.training = training


def _stop_block(hooks: Sequence[str], needs_logits: bool, num_blocks: int) -> tuple[int, bool]:
    """Blocks to run and whether the final norm is needed, from the hooks the objectives read."""
    if needs_logits:
        return num_blocks, True
    stop, need_norm = 0, False
    for name in hooks:
        parsed = split_block_name(name)
        if parsed is not None:
            stop = max(stop, parsed[0] + 1)
        elif name.startswith("stages.") and name.split(".")[1].isdigit():
            stop = max(stop, int(name.split(".")[1]) + 1)
        elif name == "embed":  # adapters may record it as block 0's input
            stop = max(stop, 1)
        else:  # final_norm, features
            return num_blocks, True
    return stop, need_norm


class StagedForward:
    """Staged forward that runs only what the objectives read; returns the activations they need."""

    def __init__(self, backbone: Backbone, objectives: Sequence[Objective]) -> None:
        self.backbone = backbone
        self.hooks = list(dict.fromkeys(h for o in objectives for h in o.hooks()))
        self.needs_logits = any(o.needs_logits for o in objectives)
        if self.needs_logits and not backbone.spec.classifies:
            raise VitscopeValueError(f"{backbone.spec.name} has no classifier head (no class logits); a class-logit "
                                     "objective needs one")
        self.stop, self.need_norm = _stop_block(self.hooks, self.needs_logits, backbone.spec.num_blocks)
        spec = backbone.spec
        self.mean = torch.tensor(spec.mean).view(1, 3, 1, 1)
        self.std = torch.tensor(spec.std).view(1, 3, 1, 1)

    def __call__(self, rec, pixels01: torch.Tensor) -> dict[str, torch.Tensor]:
        b = self.backbone
        x = (pixels01 - self.mean.to(pixels01)) / self.std.to(pixels01)  # the model's normalisation, last
        tokens = b.run_blocks(b.embed(x), 0, self.stop)
        logits = None
        if self.need_norm:  # before reading the record: the norm's own hook (final_norm, features) fills it
            normed = b.final_norm(tokens)
            if self.needs_logits:
                logits = b.head(normed if b.head_after_final_norm else tokens)
        acts = {name: rec[name] for name in self.hooks}
        if logits is not None:
            acts["logits"] = logits
        return acts


def _grid(backbone: Backbone, size: tuple[int, int]) -> tuple[int, int]:
    return backbone.spec.grid_for(*size) if backbone.spec.is_transformer else backbone.spec.grid


def render(
    backbone: Backbone,
    objectives: Objective | Sequence[Objective],
    config: FeatvizConfig | None = None,
    callback: Callable[[StepInfo], None] | None = None,
    device: str | torch.device | None = None,
    image_size: tuple[int, int] | None = None,
) -> FeatvizResult:
    """Optimise one image per objective so that it maximises the objective.

    Loss of unit u per step: ``-mean_k obj_u(aug_k(x_u)) + lambda_tv * mean_k TV(aug_k(x_u))``; the total
    loss is the sum over units. Pixels start ``U[0, 1]``, Adam with a cosine schedule, clamped to [0, 1]
    after each step; the model's normalisation is applied after the augmentations. Each unit draws its start and
    its augmentations from a generator of its own seeded with ``config.seed``, so its image and numbers are those
    of the unit rendered alone, whichever units share the run.

    Args:
        backbone: any Backbone (transformer or CNN); its weights are frozen during the run and restored.
        objectives: one objective or a list (one image each).
        config: settings; default :class:`FeatvizConfig` (the published recipe).
        callback: called with a :class:`StepInfo` after every step (save snapshots, print progress...).
        device: where to run (default: the backbone's device).
        image_size: ``(H, W)`` of the optimised images (default: the model's input size).

    Returns:
        A :class:`FeatvizResult` (images on the CPU).

    Raises:
        FeatvizDivergedError: the loss became infinite or NaN (a ``VitscopeRuntimeError`` and a
            ``FloatingPointError``).
    """
    cfg = config or FeatvizConfig()
    objs = [objectives] if isinstance(objectives, Objective) else list(objectives)
    if not objs or not all(isinstance(o, Objective) for o in objs):
        raise VitscopeTypeError("render needs one Objective or a non-empty list of Objectives")
    dev = torch.device(device) if device is not None else backbone.device
    size = tuple(image_size or backbone.spec.image_size)
    grid = _grid(backbone, size)
    # every unit its own generator seeded alike: its image is the one it gets rendered alone, whatever else runs
    gens = [torch.Generator().manual_seed(cfg.seed) for _ in objs]
    u, copies = len(objs), cfg.augment.copies
    pixels = torch.cat([torch.rand(1, 3, *size, generator=g) for g in gens]).to(dev).requires_grad_(True)
    opt = torch.optim.Adam([pixels], lr=cfg.lr, betas=cfg.betas)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.steps, eta_min=0.0) \
        if cfg.schedule == "cosine" else None
    forward = StagedForward(backbone, objs)
    losses = torch.empty(cfg.steps, u, dtype=torch.float64)
    activations = torch.empty(cfg.steps, u, dtype=torch.float64)
    backbone.to(dev)
    with frozen(backbone.model), backbone.record(forward.hooks or ["embed"], detach=False) as rec:
        for step in range(cfg.steps):
            batch = torch.cat([augment(pixels[i : i + 1], step, cfg.steps, g, cfg.augment)
                               for i, g in enumerate(gens)])  # [U * copies, 3, H, W], unit-major
            acts = forward(rec, batch)
            # each objective reads the whole batch; unit u keeps its own copies
            act = torch.stack([o(acts, backbone.spec, grid).view(u, copies)[i] for i, o in enumerate(objs)])
            tv = total_variation(batch, reduction="none").view(u, copies)
            loss_u = -act.mean(dim=1) + cfg.lambda_tv * tv.mean(dim=1)
            opt.zero_grad(set_to_none=True)
            loss_u.sum().backward()
            opt.step()
            if sched is not None:
                sched.step()
            with torch.no_grad():
                pixels.clamp_(0.0, 1.0)
            losses[step] = loss_u.detach().double().cpu()
            activations[step] = act.detach().double().mean(dim=1).cpu()
            if not math.isfinite(float(losses[step].sum())):
                raise FeatvizDivergedError(f"feature visualisation diverged at step {step} (loss is not finite); "
                                           "try a smaller --lambda-tv or lr")
            if callback is not None:
                callback(StepInfo(step, cfg.steps, pixels.detach(), losses[step].clone(), activations[step].clone()))
    return FeatvizResult([o.name for o in objs], pixels.detach().float().cpu(), losses, activations, cfg)


@torch.no_grad()
def evaluate(
    backbone: Backbone, objectives: Objective | Sequence[Objective], images01: torch.Tensor, batch_size: int = 64,
) -> torch.Tensor:
    """Objective values of un-augmented images.

    Args:
        backbone: the model.
        objectives: one objective or a list of ``U``.
        images01: ``[B, 3, H, W]`` pixels in [0, 1] (float) or uint8 ``[0, 255]``.
        batch_size: images per forward.

    Returns:
        ``[B, U]`` float64 (``[B]`` for a single objective).
    """
    single = isinstance(objectives, Objective)
    objs = [objectives] if single else list(objectives)
    x = images01.float() / 255.0 if images01.dtype == torch.uint8 else images01.float()
    forward = StagedForward(backbone, objs)
    grid = _grid(backbone, tuple(x.shape[-2:]))
    out = []
    with frozen(backbone.model), backbone.record(forward.hooks or ["embed"]) as rec:
        for chunk in x.split(batch_size):
            acts = forward(rec, chunk.to(backbone.device))
            out.append(torch.stack([o(acts, backbone.spec, grid) for o in objs], dim=1).double().cpu())
    values = torch.cat(out)
    return values[:, 0] if single else values
