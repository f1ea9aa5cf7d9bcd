"""Supervised classification with cross-entropy (paper 002's supervised ViT, DeiT-style recipe, small)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vitscope.models.backbone import Backbone
from vitscope.train.augment import random_erasing, random_resized_crop
from vitscope.train.data import normalise
from vitscope.train.loop import Recipe, cosine_schedule

__all__ = ["SupervisedConfig", "SupervisedRecipe"]


@dataclass(frozen=True)
class SupervisedConfig:
    """Hyper-parameters of supervised training.

    Attributes:
        lr: peak AdamW learning rate.
        weight_decay: AdamW weight decay (not applied to biases, norms, tokens and position embeddings).
        warmup: linear warm-up steps.
        label_smoothing: cross-entropy label smoothing.
        crop_scale: area range of the random resized crop.
        erase_prob: probability of DeiT's random erasing per image after the crop (0: off, and the
            augmentation stream is then exactly that of a recipe without it).
    """

    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup: int = 100
    label_smoothing: float = 0.1
    crop_scale: tuple[float, float] = (0.35, 1.0)
    erase_prob: float = 0.0


def decay_groups(module: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW parameter groups: no decay on 1-d parameters (biases, norms) and on tokens/embeddings."""
    decay, no_decay = [], []
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        skip = p.dim() <= 1 or name.endswith(("cls_token", "reg_token", "pos_embed", "mask_token"))
        (no_decay if skip else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class SupervisedRecipe(Recipe):
    """Cross-entropy on the backbone's classifier head (the model must have ``num_classes`` outputs).

    Args:
        backbone: a wrapped model whose forward returns logits (a tiny ViT or tiny ResNet with a head).
        config: hyper-parameters.
    """

    name = "supervised"

    def __init__(self, backbone: Backbone, config: SupervisedConfig = SupervisedConfig()) -> None:
        self._backbone, self.config = backbone, config
        self.model = backbone.model

    def modules(self) -> dict[str, nn.Module]:
        return {"model": self.model}

    def optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(decay_groups(self.model, self.config.weight_decay), lr=self.config.lr)

    def scheduler(self, optimizer, steps):
        return cosine_schedule(optimizer, steps, min(self.config.warmup, steps // 5 + 1))

    def loss(self, images: torch.Tensor, labels: torch.Tensor, step: int, gen: torch.Generator) -> torch.Tensor:
        spec = self._backbone.spec
        x = random_resized_crop(images.float() / 255.0, spec.image_size[0], self.config.crop_scale, gen)
        if self.config.erase_prob > 0:
            x = random_erasing(x, gen, p=self.config.erase_prob)
        logits = self.model(normalise(x, spec.mean, spec.std))
        return F.cross_entropy(logits, labels, label_smoothing=self.config.label_smoothing)

    def backbone(self) -> Backbone:
        return self._backbone
