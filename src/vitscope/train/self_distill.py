"""Label-free self-distillation in the style of DINO (Caron et al.; paper 002's DINO model), small.

A student and an exponential-moving-average teacher see different crops of one image: two global
crops (teacher and student) and several smaller local crops (student only). The student matches the
teacher's centred and sharpened output distribution over ``out_dim`` prototypes; the centre is an EMA
of the teacher's outputs. The teacher is the model kept after training (as DINO's released weights).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vitscope.errors import VitscopeValueError
from vitscope.models.backbone import Backbone
from vitscope.train.augment import (
    color_jitter,
    foreground_points,
    gaussian_blur,
    grayscale,
    random_resized_crop,
    solarize,
    swap_background,
)
from vitscope.train.data import normalise
from vitscope.train.loop import Recipe, cosine_schedule
from vitscope.train.supervised import decay_groups

__all__ = ["DINOHead", "SelfDistillConfig", "SelfDistillRecipe", "koleo_loss"]


@dataclass(frozen=True)
class SelfDistillConfig:
    """Hyper-parameters of DINO-style training.

    Attributes:
        out_dim: prototypes of the projection head.
        hidden_dim, bottleneck_dim: projection head MLP sizes.
        local_crops: number of local crops per image; local_size: their side in pixels.
        jitter: colour jitter strengths ``(brightness, contrast, saturation, hue)``; grayscale: its probability.
        solarize: probability of solarizing the second global crop (DINO: 0.2).
        background_swap: probability that a view's background is taken from another image of the batch
            before cropping (:func:`~vitscope.train.augment.swap_background`); needs the training set's
            foreground masks. 0 (the default) is DINO's recipe.
        global_size: side of the global crops in pixels (None: the model's input size). Smaller global
            crops make a step cheaper; position embeddings are interpolated, as for the local crops.
        global_size_until: fraction of the steps (0 to 1) that use ``global_size``; the rest use the model's
            input size, a short final phase at the test resolution (as DINOv2 ends its training at full
            resolution). Has no effect without ``global_size``.
        global_scale, local_scale: area ranges of the global and local crops.
        local_on_object: probability that a local crop is centred on a random object pixel
            (:func:`~vitscope.train.augment.foreground_points`, object-aware cropping) rather than placed
            uniformly; needs the foreground masks. 0 (the default) is DINO's recipe.
        koleo: weight of the KoLeo regulariser (DINOv2; :func:`koleo_loss`) on the student's CLS features of
            the first global crops, which spreads the batch's features apart. 0 (the default) is DINO's recipe.
        student_temp: student softmax temperature.
        teacher_temp, warmup_teacher_temp, teacher_temp_warmup: teacher sharpening, warmed up linearly
            over that fraction of training.
        center_momentum: EMA of the centre.
        momentum: teacher EMA momentum at the start, raised to ``final_momentum`` with a cosine (DINO: 1).
            In a short run a final momentum near 1 freezes the teacher (the kept model) for the last
            fraction of training while the student still learns.
        lr, weight_decay, warmup, grad_clip: AdamW with cosine decay.
        freeze_last_layer: steps during which the prototypes stay fixed (DINO's stabiliser for the start).
        seed: initialises the projection head.
    """

    out_dim: int = 1024
    hidden_dim: int = 256
    bottleneck_dim: int = 64
    local_crops: int = 4
    local_size: int = 32
    global_size: int | None = None
    global_size_until: float = 1.0
    global_scale: tuple[float, float] = (0.4, 1.0)
    local_scale: tuple[float, float] = (0.1, 0.4)
    local_on_object: float = 0.0
    jitter: tuple[float, float, float, float] = (0.4, 0.4, 0.2, 0.0)
    grayscale: float = 0.2
    solarize: float = 0.2
    background_swap: float = 0.0
    koleo: float = 0.0
    student_temp: float = 0.1
    teacher_temp: float = 0.04
    warmup_teacher_temp: float = 0.04
    teacher_temp_warmup: float = 0.3
    center_momentum: float = 0.9
    momentum: float = 0.996
    final_momentum: float = 1.0
    lr: float = 5e-4
    weight_decay: float = 0.04
    warmup: int = 150
    grad_clip: float = 3.0
    freeze_last_layer: int = 150
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.global_size_until <= 1.0:
            raise VitscopeValueError("global_size_until is a fraction of the steps (0 to 1), got "
                                     f"{self.global_size_until}")


def koleo_loss(features: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Kozachenko-Leonenko entropy estimator as a loss: minus the mean log distance to the nearest neighbour.

    Args:
        features: ``[B, D]``, L2-normalised here; ``B >= 2``.
        eps: added to the distances (identical features).

    Returns:
        Scalar ``-mean_i log(min_{j != i} ||x_i - x_j|| + eps)``; lower when the features are spread apart.

    Raises:
        ValueError: fewer than two rows (no neighbour to measure).
    """
    if len(features) < 2:
        raise VitscopeValueError(f"koleo_loss needs at least 2 features, got {len(features)}")
    with torch.autocast(features.device.type, enabled=False):  # bf16 cosines would pick wrong neighbours
        x = F.normalize(features.float(), dim=-1)
        sims = x @ x.T
        sims.fill_diagonal_(-2.0)  # below any cosine: never one's own neighbour
        nearest = x[sims.argmax(dim=1)]
        return -torch.log((x - nearest).norm(dim=-1) + eps).mean()


class DINOHead(nn.Module):
    """MLP projection, L2 normalisation, then a weight-normalised linear layer (unit-norm rows)."""

    def __init__(self, dim: int, out_dim: int, hidden: int, bottleneck: int, seed: int = 0) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                                     nn.Linear(hidden, bottleneck))
            self.last = nn.Parameter(torch.randn(out_dim, bottleneck) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.normalize(self.mlp(x), dim=-1)
        return F.linear(x, F.normalize(self.last, dim=-1))


class _Student(nn.Module):
    def __init__(self, model: nn.Module, head: DINOHead) -> None:
        super().__init__()
        self.model, self.head = model, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.model.forward_features(x)[:, 0])


class _Centre(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("center", torch.zeros(1, dim))


class SelfDistillRecipe(Recipe):
    """DINO-style self-distillation of a tiny ViT (CLS token output).

    Args:
        backbone: a wrapped tiny ViT; its model becomes the teacher (what is kept), a copy the student.
        config: hyper-parameters.
    """

    name = "self-distill"

    def __init__(self, backbone: Backbone, config: SelfDistillConfig = SelfDistillConfig()) -> None:
        self._backbone, self.config = backbone, config
        c, dim = config, backbone.spec.embed_dim
        head = DINOHead(dim, c.out_dim, c.hidden_dim, c.bottleneck_dim, c.seed)
        self.student = _Student(copy.deepcopy(backbone.model), head)
        self.teacher = _Student(backbone.model, copy.deepcopy(head))
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self.centre = _Centre(c.out_dim)
        self.needs_foreground = c.background_swap > 0 or c.local_on_object > 0

    def modules(self) -> dict[str, nn.Module]:
        return {"student": self.student, "teacher": self.teacher, "centre": self.centre}

    def optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(decay_groups(self.student, self.config.weight_decay), lr=self.config.lr)

    def scheduler(self, optimizer, steps):
        return cosine_schedule(optimizer, steps, min(self.config.warmup, steps // 5 + 1), final_fraction=0.01)

    def grad_clip(self) -> float | None:
        return self.config.grad_clip

    def _global_size(self, step: int, steps: int) -> int:
        c, full = self.config, self._backbone.spec.image_size[0]
        return c.global_size if c.global_size and step < c.global_size_until * steps else full

    def _views(self, images: torch.Tensor, gen: torch.Generator, foreground: torch.Tensor | None = None,
               size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Two global crops of side ``size`` (None: the model's input size; stacked ``[2B, ...]``) and the
        local crops (stacked ``[nB, ...]``)."""
        c, spec = self.config, self._backbone.spec
        x = images.float() / 255.0
        size = size or spec.image_size[0]

        def view(out: int, scale: tuple[float, float], blur: float, sol: float, on_object: float = 0.0) -> torch.Tensor:
            v, centre = x, None
            if c.background_swap > 0:  # skipped at 0 so that DINO's recipe draws the same random numbers
                v = swap_background(x, foreground, gen, p=c.background_swap)
            if on_object > 0:
                centre = foreground_points(foreground, gen)
                centre[torch.rand(len(x), generator=gen) >= on_object] = float("nan")
            v = random_resized_crop(v, out, scale, gen, centre=centre)
            bri, con, sat, hue = c.jitter
            v = grayscale(color_jitter(v, gen, bri, con, sat, hue=hue), gen, p=c.grayscale)
            v = solarize(gaussian_blur(v, gen, p=blur), gen, p=sol)
            return normalise(v, spec.mean, spec.std)

        globals_ = torch.cat([view(size, c.global_scale, 1.0, 0.0), view(size, c.global_scale, 0.1, c.solarize)])
        locals_ = [view(c.local_size, c.local_scale, 0.5, 0.0, c.local_on_object) for _ in range(c.local_crops)]
        return globals_, torch.cat(locals_) if locals_ else globals_[:0]

    def _teacher_temp(self, step: int, steps: int) -> float:
        c = self.config
        warm = max(1, int(c.teacher_temp_warmup * steps))
        t = min(1.0, step / warm)
        return c.warmup_teacher_temp + t * (c.teacher_temp - c.warmup_teacher_temp)

    def loss(self, images: torch.Tensor, labels: torch.Tensor, step: int, gen: torch.Generator,
             foreground: torch.Tensor | None = None) -> torch.Tensor:
        c = self.config
        if self.needs_foreground:
            self.require_foreground(foreground)
        self.student.head.last.requires_grad_(step >= c.freeze_last_layer)  # no gradient -> AdamW skips it
        globals_, locals_ = self._views(images, gen, foreground, self._global_size(step, self.total_steps))
        with torch.no_grad():
            t_out = self.teacher(globals_)
            targets = F.softmax((t_out - self.centre.center) / self._teacher_temp(step, self.total_steps), dim=-1)
            self.centre.center.mul_(c.center_momentum).add_(t_out.mean(0, keepdim=True), alpha=1 - c.center_momentum)
        student_cls = self.student.model.forward_features(globals_)[:, 0]
        s_out = [self.student.head(student_cls)]
        if len(locals_):
            s_out.append(self.student(locals_))
        student = F.log_softmax(torch.cat(s_out) / c.student_temp, dim=-1).chunk(2 + c.local_crops)
        teacher = targets.chunk(2)
        total, terms = 0.0, 0
        for iq, tq in enumerate(teacher):
            for v, sv in enumerate(student):
                if v == iq:
                    continue
                total = total + (-tq * sv).sum(-1).mean()
                terms += 1
        if c.koleo > 0:
            return total / terms + c.koleo * koleo_loss(student_cls[: len(images)])
        return total / terms

    def after_step(self, step: int, steps: int) -> None:
        c = self.config
        m = c.final_momentum - (c.final_momentum - c.momentum) * (math.cos(math.pi * step / steps) + 1) / 2
        with torch.no_grad():
            for ps, pt in zip(self.student.parameters(), self.teacher.parameters(), strict=True):
                pt.mul_(m).add_(ps.detach(), alpha=1 - m)

    def backbone(self) -> Backbone:
        return self._backbone
