"""Embedding networks trained with metric-learning losses (paper 000 section 4), small.

The embedding is the model's pooled output passed through a linear projection (a tiny ViT with
``global_pool="avg"`` and a projection ``head``, or a tiny ResNet whose ``fc`` is the projection), as the
networks paper 000 explains. Losses come from pytorch-metric-learning: Proxy-Anchor (paper 000's SOP
models) or ArcFace (its Hotels-50k and GLM models). Optimisation is SGD with momentum and a one-cycle
learning-rate schedule, as in the paper; the loss's own parameters (proxies, class centres) get a larger
rate (``loss_lr_factor``), as the Proxy-Anchor paper does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vitscope.errors import VitscopeValueError
from vitscope.models.backbone import Backbone
from vitscope.train.augment import color_jitter, random_resized_crop
from vitscope.train.data import normalise
from vitscope.train.loop import Recipe
from vitscope.train.supervised import decay_groups

__all__ = ["METRIC_LOSSES", "MetricConfig", "MetricRecipe", "make_metric_loss"]

METRIC_LOSSES = ("proxy_anchor", "arcface")


@dataclass(frozen=True)
class MetricConfig:
    """Hyper-parameters of metric learning.

    Attributes:
        loss: ``"proxy_anchor"`` (margin 0.1, alpha 32) or ``"arcface"`` (margin 28.6 degrees, scale 64).
        lr: peak SGD learning rate of the network (one-cycle schedule).
        loss_lr_factor: the loss parameters' rate relative to ``lr``.
        momentum, weight_decay: SGD settings.
        pct_start: fraction of the cycle spent increasing the rate.
        crop_scale: area range of the random resized crop.
    """

    loss: str = "proxy_anchor"
    lr: float = 0.02
    loss_lr_factor: float = 100.0
    momentum: float = 0.9
    weight_decay: float = 1e-4
    pct_start: float = 0.3
    crop_scale: tuple[float, float] = (0.35, 1.0)

    def __post_init__(self) -> None:
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise VitscopeValueError(f"lr must be a finite number > 0, got {self.lr!r}")
        if not (isinstance(self.loss_lr_factor, (int, float)) and math.isfinite(self.loss_lr_factor)
                and self.loss_lr_factor > 0):
            raise VitscopeValueError(f"loss_lr_factor must be a finite number > 0, got {self.loss_lr_factor!r}")
        if not (isinstance(self.pct_start, (int, float)) and 0 < self.pct_start < 1):
            raise VitscopeValueError(f"pct_start must be in (0, 1), got {self.pct_start!r}")
        scale = tuple(self.crop_scale) if isinstance(self.crop_scale, (tuple, list)) else ()
        if not (len(scale) == 2 and all(isinstance(v, (int, float)) for v in scale)
                and 0 < scale[0] <= scale[1] <= 1):
            raise VitscopeValueError(f"crop_scale must be (low, high) with 0 < low <= high <= 1, "
                                     f"got {self.crop_scale!r}")


def make_metric_loss(name: str, num_classes: int, embedding_size: int) -> nn.Module:
    """The pytorch-metric-learning loss ``name`` for ``num_classes`` training identities."""
    from pytorch_metric_learning import losses

    if name == "proxy_anchor":
        return losses.ProxyAnchorLoss(num_classes=num_classes, embedding_size=embedding_size, margin=0.1, alpha=32)
    if name == "arcface":
        return losses.ArcFaceLoss(num_classes=num_classes, embedding_size=embedding_size, margin=28.6, scale=64)
    raise VitscopeValueError(f"unknown metric loss '{name}'; choose one of {', '.join(METRIC_LOSSES)}")


class MetricRecipe(Recipe):
    """Train an embedding network on identity labels.

    Args:
        backbone: a wrapped model whose forward returns the embedding (projection included).
        num_classes: number of training identities (labels are ``0..num_classes-1``).
        config: hyper-parameters.
        embedder: the module to train (default: ``backbone.model``, whose output is the embedding);
            :class:`vitscope.train.embedding.EmbeddingNet` puts a projection on any backbone.
    """

    name = "metric"

    def __init__(self, backbone: Backbone, num_classes: int, config: MetricConfig = MetricConfig(),
                 embedder: nn.Module | None = None) -> None:
        if num_classes < 2:
            raise VitscopeValueError(f"metric learning needs at least 2 identities, got {num_classes}")
        self._backbone, self.config = backbone, config
        self.model = embedder if embedder is not None else backbone.model
        with torch.no_grad():
            probe = self.model.eval()(torch.zeros(1, 3, *backbone.spec.image_size))
        self.embedding_size = int(probe.shape[-1])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.criterion = make_metric_loss(config.loss, num_classes, self.embedding_size)

    def modules(self) -> dict[str, nn.Module]:
        return {"model": self.model, "loss": self.criterion}

    def optimizer(self) -> torch.optim.Optimizer:
        c = self.config
        groups = decay_groups(self.model, c.weight_decay)
        groups.append({"params": list(self.criterion.parameters()), "weight_decay": 0.0, "lr": c.lr * c.loss_lr_factor})
        return torch.optim.SGD(groups, lr=c.lr, momentum=c.momentum, nesterov=True)

    def scheduler(self, optimizer, steps):
        max_lr = [g["lr"] for g in optimizer.param_groups]
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=max_lr, total_steps=steps,
                                                   pct_start=self.config.pct_start)

    def loss(self, images: torch.Tensor, labels: torch.Tensor, step: int, gen: torch.Generator) -> torch.Tensor:
        spec = self._backbone.spec
        x = random_resized_crop(images.float() / 255.0, spec.image_size[0], self.config.crop_scale, gen)
        x = color_jitter(x, gen, brightness=0.2, contrast=0.2, saturation=0.1)
        embeddings = self.model(normalise(x, spec.mean, spec.std))
        # the losses cast their own parameters to the embeddings' dtype: under bf16 autocast the proxies would
        # become bf16 (and so would their checkpoints), so the loss runs in float32
        with torch.autocast(embeddings.device.type, enabled=False):
            return self.criterion(embeddings.float(), labels)

    def settings(self) -> dict[str, Any]:
        """The recipe's settings and, for an embedder with its own (pooling, embedding size), those too."""
        out = super().settings()
        describe = getattr(self.model, "settings", None)
        if callable(describe):
            out["embedder"] = describe()
        return out

    def backbone(self) -> Backbone:
        return self._backbone
