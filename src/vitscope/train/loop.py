"""The training loop every recipe shares: seeded batches, progress, resumable checkpoints, snapshots.

A recipe (:class:`Recipe`) says what to optimise; :func:`fit` runs it for a number of steps. Batches come
from a per-epoch permutation seeded by ``(seed, epoch)`` and augmentations from one generator whose
state is checkpointed, so a run resumed from a checkpoint continues exactly as the uninterrupted run
(same thread count, CPU). A checkpoint is keyed by everything that decides the numbers (:func:`train_key`: the
recipe and its settings, the loop's settings, the model's spec and starting weights, the training set); one
written under another key is ignored with a message and training starts over, never continued. Checkpoints
hold tensors and plain values only and are read back with ``torch.load(weights_only=True)``; they are written
to a temporary file and renamed (atomic).
"""

from __future__ import annotations

import json
import math
import os
import pickle
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitscope._version import __version__
from vitscope.atomic import atomic_path, remove_leftovers
from vitscope.errors import VitscopeRuntimeError, VitscopeValueError
from vitscope.models.backbone import Backbone
from vitscope.models.digest import digest, tensors_digest
from vitscope.train.data import TensorImages

__all__ = ["LoopConfig", "Recipe", "TrainResult", "TrainingDivergedError", "cosine_schedule", "fit", "train_key"]

CHECKPOINT_NAME = "train_state.pt"
KEY_FORMAT = 1


class TrainingDivergedError(VitscopeRuntimeError, FloatingPointError):
    """A training loss stopped being a finite number (still a ``FloatingPointError`` to catch)."""


@dataclass
class LoopConfig:
    """How long and how to run a recipe.

    Attributes:
        steps: optimisation steps.
        batch_size: images per step.
        seed: seeds batch order and augmentations (model initialisation is seeded by the model config).
        checkpoint_dir: where to keep the resumable state (None: no checkpoints); a state saved there by a
            run with other settings, model or data is ignored with a message (:func:`train_key`).
        checkpoint_every: steps between checkpoints.
        snapshot_steps: steps after which a copy of the trained model's weights is kept (training curves).
        progress: show a progress bar (default: when stderr is a terminal; otherwise, as in batch-job
            logs, one line per 10% of training).
        autocast: ``"bf16"`` runs the forward passes under bfloat16 autocast (about 1.7x faster on CPUs
            with AVX-512 BF16; weights, optimiser and losses stay float32), None for float32 throughout.
        math_attention: while training, modules with a timm-style ``fused_attn`` switch compute attention as
            explicit products and softmax instead of the fused kernel; afterwards the switches are restored.
            For vitscope's tiny ViTs (17-65 tokens, :func:`~vitscope.models.tiny.explicit_attention`, float32
            logits and softmax) under bf16 autocast on one CPU thread a zoo recipe's step is 1.4-2.0x faster
            (``benchmarks/train_step.py``). timm models use their own explicit path (bfloat16 logits under
            autocast); Hugging Face models have no such switch and are left as they are.
    """

    steps: int
    batch_size: int = 128
    seed: int = 0
    checkpoint_dir: str | os.PathLike | None = None
    checkpoint_every: int = 200
    snapshot_steps: tuple[int, ...] = ()
    progress: bool | None = None
    autocast: str | None = None
    math_attention: bool = False

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1:
            raise VitscopeValueError(f"steps and batch_size must be >= 1, got {self.steps} and {self.batch_size}")
        if self.autocast not in (None, "bf16"):
            raise VitscopeValueError(f"autocast must be None or 'bf16', got {self.autocast!r}")


@dataclass
class TrainResult:
    """What :func:`fit` returns.

    Attributes:
        backbone: the trained model, wrapped (eval mode).
        losses: loss of every step.
        snapshots: step -> state dict of the model at that step (CPU tensors).
        resumed_from: step the run resumed from (0 when it started fresh).
    """

    backbone: Backbone
    losses: list[float]
    snapshots: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    resumed_from: int = 0


class Recipe(ABC):
    """A training objective: its modules, optimiser, schedule and per-step loss."""

    name: str = "recipe"
    total_steps: int = 1  # set by fit() before the first step (schedules inside the loss use it)
    needs_foreground: bool = False  # loss() then also gets ``foreground=`` [B, H, W] masks of the batch

    @abstractmethod
    def modules(self) -> dict[str, nn.Module]:
        """Every module whose state must be checkpointed (model, heads, teacher, loss parameters)."""

    @abstractmethod
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimiser (built once, after the modules)."""

    @abstractmethod
    def scheduler(self, optimizer: torch.optim.Optimizer, steps: int) -> torch.optim.lr_scheduler.LRScheduler:
        """Learning-rate schedule over ``steps`` steps (stepped after every optimiser step)."""

    @abstractmethod
    def loss(self, images: torch.Tensor, labels: torch.Tensor, step: int, gen: torch.Generator) -> torch.Tensor:
        """Scalar loss of one batch (``images`` uint8 ``[B, 3, H, W]``, ``labels`` ``[B]``)."""

    @abstractmethod
    def backbone(self) -> Backbone:
        """The model this recipe trains, wrapped as a Backbone."""

    def after_step(self, step: int, steps: int) -> None:
        """Hook after each optimiser step (EMA teachers, weight clamps)."""
        return None

    def grad_clip(self) -> float | None:
        """Clip the global gradient norm to this value (None: no clipping)."""
        return None

    def require_foreground(self, foreground: torch.Tensor | None) -> torch.Tensor:
        """The batch's masks, or a ValueError when this configuration needs them and got none."""
        if foreground is None:
            raise VitscopeValueError(f"{self.name}: this configuration needs the batch's foreground masks")
        return foreground

    def snapshot_module(self) -> nn.Module:
        """The module whose weights are snapshotted (default: the backbone's model)."""
        return self.backbone().model

    def settings(self) -> dict[str, Any]:
        """What decides this recipe's numbers beyond its modules' weights, JSON-able (keys its checkpoints).

        The default is the recipe's name and class and its ``config`` dataclass; a recipe with other arguments
        (a mask function, a curriculum) adds them.
        """
        config = getattr(self, "config", None)
        return {"name": self.name, "class": f"{type(self).__module__}.{type(self).__qualname__}",
                "config": asdict(config) if is_dataclass(config) else repr(config)}


def cosine_schedule(optimizer: torch.optim.Optimizer, steps: int, warmup: int,
                    final_fraction: float = 0.0) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over ``warmup`` steps, then cosine decay to ``final_fraction`` of the base rate."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        t = (step - warmup) / max(1, steps - warmup)
        return final_fraction + (1 - final_fraction) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _batches(n: int, batch_size: int, seed: int, start_step: int):
    """Yield ``(step, indices)`` from per-epoch permutations, starting at ``start_step`` (drop last)."""
    per_epoch = n // batch_size
    if per_epoch == 0:
        raise VitscopeValueError(f"the training set ({n} images) is smaller than one batch ({batch_size})")
    step = start_step
    while True:
        epoch, pos = divmod(step, per_epoch)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
        for p in range(pos, per_epoch):
            yield step, perm[p * batch_size:(p + 1) * batch_size]
            step += 1


def train_key(recipe: Recipe, modules: dict[str, nn.Module], data: TensorImages,
              config: LoopConfig) -> dict[str, Any]:
    """Everything that decides a training run's numbers, as a JSON-able dict (its checkpoint must match it).

    Args:
        recipe: the objective: its :meth:`Recipe.settings` and its backbone's spec (the number of heads changes
            no weight's shape).
        modules: ``recipe.modules()`` before training (their starting weights and which parameters train).
        data: the training set (a digest of its images and labels, and of the masks when the recipe reads them).
        config: the loop's settings that change numbers (not the checkpoint folder, interval or progress).
    """
    weights = {f"{k}.{n}": t for k, m in modules.items() for n, t in m.state_dict().items()}
    trainable = sorted(f"{k}.{n}" for k, m in modules.items() for n, p in m.named_parameters() if p.requires_grad)
    tensors = {"images": data.images, "labels": data.labels}
    if recipe.needs_foreground and data.foreground is not None:
        tensors["foreground"] = data.foreground
    spec = {k: v for k, v in recipe.backbone().spec.to_dict().items() if k != "name"}  # the name changes nothing
    return {
        "format": KEY_FORMAT,
        "vitscope": __version__,
        "recipe": recipe.settings(),
        "loop": {"steps": config.steps, "batch_size": config.batch_size, "seed": config.seed,
                 "snapshot_steps": sorted(config.snapshot_steps), "autocast": config.autocast,
                 "math_attention": config.math_attention},  # the kernels differ in the last bits
        "spec": spec,
        "weights": tensors_digest(weights),
        "trainable": digest(trainable),
        "data": {"images": len(data), "digest": tensors_digest(tensors)},
    }


def _key_text(key: Any) -> str:
    return json.dumps(key, sort_keys=True, default=str, separators=(",", ":"))


def _flat(key: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Dotted path -> JSON text of every leaf (``recipe.config.lr``), to name what changed."""
    out: dict[str, str] = {}
    for k, v in key.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = _key_text(v)
    return out


def _changed(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    a, b = _flat(old), _flat(new)
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def _resumable(path: Path, key: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The state saved at ``path`` when it was saved under ``key``; otherwise None, said on stderr."""
    if not path.exists():
        return None
    try:
        state = torch.load(path, weights_only=True)
    except (OSError, EOFError, RuntimeError, ValueError, pickle.UnpicklingError) as err:
        # a torn write (power loss), an empty or a foreign file: nothing to continue from
        print(f"{name}: ignoring unreadable training state {path} ({type(err).__name__}): starting over",
              file=sys.stderr, flush=True)
        return None
    if not isinstance(state, dict):
        print(f"{name}: ignoring unreadable training state {path} (not a vitscope training state): starting over",
              file=sys.stderr, flush=True)
        return None
    if state.get("key") == _key_text(key):
        return state
    try:
        saved = json.loads(state["key"]) if isinstance(state.get("key"), str) else {}
    except json.JSONDecodeError:
        saved = {}
    saved = saved if isinstance(saved, dict) else {}
    changed = ", ".join(_changed(saved, key)) if saved else "key (saved without one by an older vitscope)"
    print(f"{name}: ignoring training state {path}: it belongs to a different run (changed: {changed}); "
          "starting over", file=sys.stderr, flush=True)
    return None


def _save_state(path: Path, state: dict[str, Any]) -> None:
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def _progress(enabled: bool | None, description: str, total: int):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    enabled = sys.stderr.isatty() if enabled is None else enabled
    bar = Progress(TextColumn("[bold]train[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("loss {task.fields[loss]:.4f}"), TimeRemainingColumn(), disable=not enabled,
                   console=Console(stderr=True))  # stdout holds results only
    return bar, bar.add_task(description, total=total, loss=float("nan"))


@contextmanager
def _attention_kernel(modules: dict[str, nn.Module], fused: bool) -> Iterator[None]:
    """Set every ``fused_attn`` switch under ``modules`` to ``fused``; restore the old values on exit."""
    switches = {id(m): m for root in modules.values() for m in root.modules()
                if isinstance(getattr(m, "fused_attn", None), bool)}.values()
    before = [m.fused_attn for m in switches]
    for m in switches:
        m.fused_attn = fused
    try:
        yield
    finally:
        for m, value in zip(switches, before, strict=True):
            m.fused_attn = value


def fit(recipe: Recipe, data: TensorImages, config: LoopConfig) -> TrainResult:
    """Train ``recipe`` on ``data`` for ``config.steps`` steps (resuming from a checkpoint if one exists).

    Args:
        recipe: the objective.
        data: training images and labels.
        config: steps, batch size, seed, checkpoints, snapshots.

    Returns:
        The trained backbone (eval mode), per-step losses and the requested snapshots.

    A checkpoint in ``config.checkpoint_dir`` is resumed when :func:`train_key` is unchanged; one of another run
    (other recipe settings, seed, batch size, steps, model or data) is ignored with a message on stderr, and the
    run starts over (its first save replaces it).

    Raises:
        ValueError: the recipe needs foreground masks and ``data`` has none.
        TrainingDivergedError: the loss became NaN or infinite.
    """
    if recipe.needs_foreground and data.foreground is None:
        raise VitscopeValueError(f"{recipe.name}: this configuration needs foreground masks (TensorImages.foreground); "
                                 "synthetic_split provides them, image folders do not")
    recipe.total_steps = config.steps
    modules = recipe.modules()
    optimizer = recipe.optimizer()
    scheduler = recipe.scheduler(optimizer, config.steps)
    gen = torch.Generator().manual_seed(config.seed)
    losses: list[float] = []
    snapshots: dict[int, dict[str, torch.Tensor]] = {}
    start = 0
    ckpt = Path(config.checkpoint_dir) / CHECKPOINT_NAME if config.checkpoint_dir else None
    key = train_key(recipe, modules, data, config) if ckpt is not None else {}
    if ckpt is not None:  # a killed run's half-written state would otherwise stay beside the checkpoint for good
        remove_leftovers(ckpt.parent, stale_pids=frozenset({os.getpid()}))  # this process has written nothing yet
    state = _resumable(ckpt, key, recipe.name) if ckpt is not None else None
    if state is not None:
        for name, module in modules.items():
            module.load_state_dict(state["modules"][name])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        gen.set_state(state["generator"])
        losses, snapshots, start = list(state["losses"]), dict(state["snapshots"]), int(state["step"])
    for m in modules.values():
        m.train()
    clip = recipe.grad_clip()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    bar, task = _progress(config.progress, recipe.name, config.steps)
    log_every = max(1, config.steps // 10) if config.progress is None and bar.disable else 0
    started = time.perf_counter()
    kernel = _attention_kernel(modules, fused=False) if config.math_attention else nullcontext()
    with bar, kernel:
        bar.update(task, completed=start)
        batches = _batches(len(data), config.batch_size, config.seed, start)
        for step, idx in batches:
            if step >= config.steps:
                break
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.autocast == "bf16"):
                extra = {"foreground": data.foreground[idx]} if recipe.needs_foreground else {}
                loss = recipe.loss(data.images[idx], data.labels[idx], step, gen, **extra).float()
            if not torch.isfinite(loss):
                raise TrainingDivergedError(f"{recipe.name}: loss became {loss.item()} at step {step}; "
                                         "lower the learning rate")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(params, clip)
            optimizer.step()
            scheduler.step()
            recipe.after_step(step, config.steps)
            losses.append(float(loss.detach()))
            done = step + 1
            if done in config.snapshot_steps:
                snapshots[done] = {k: v.detach().clone() for k, v in recipe.snapshot_module().state_dict().items()}
            bar.update(task, completed=done, loss=losses[-1])
            if log_every and done % log_every == 0:
                print(f"{recipe.name}: step {done}/{config.steps} loss {losses[-1]:.4f} "
                      f"({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
            if ckpt is not None and (done % config.checkpoint_every == 0 or done == config.steps):
                ckpt.parent.mkdir(parents=True, exist_ok=True)
                _save_state(ckpt, {"key": _key_text(key), "step": done,
                                   "modules": {k: m.state_dict() for k, m in modules.items()},
                                   "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                                   "generator": gen.get_state(), "losses": losses, "snapshots": snapshots})
    for m in modules.values():
        m.eval()
    return TrainResult(recipe.backbone(), losses, snapshots, start)
