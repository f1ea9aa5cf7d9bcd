"""Train a metric-learning embedding head on any backbone and your own ImageFolder (paper 000's networks).

``EmbeddingNet`` = the backbone's final tokens (or CNN map), pooled, then a linear projection: exactly the
structure :mod:`vitscope.explain`'s paired similarity decomposes, so ``net.projection`` can be handed
to it. With ``freeze_backbone`` only the projection trains (fast, and the backbone stays the one you
analyse); otherwise the whole network is fine-tuned.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from vitscope.errors import VitscopeValueError
from vitscope.models.backbone import Backbone
from vitscope.train.data import TensorImages, image_folder_tensors
from vitscope.train.loop import LoopConfig, fit
from vitscope.train.metric import MetricConfig, MetricRecipe

__all__ = ["EmbeddingNet", "train_embedding"]


class EmbeddingNet(nn.Module):
    """Pooled backbone features followed by a linear projection.

    Args:
        backbone: any Backbone with staged execution (transformers and CNNs).
        embedding_size: output dimension E.
        pooling: ``"mean"`` (spatial tokens, or the CNN map) or ``"cls"`` (transformers with a CLS token).
        freeze_backbone: train the projection only (the backbone stays in eval mode).
        seed: initialises the projection.
    """

    def __init__(self, backbone: Backbone, embedding_size: int = 128, pooling: str = "mean",
                 freeze_backbone: bool = True, seed: int = 0) -> None:
        super().__init__()
        if isinstance(embedding_size, bool) or not isinstance(embedding_size, int) or embedding_size < 1:
            raise VitscopeValueError(f"embedding_size must be an integer >= 1, got {embedding_size!r}")
        if pooling not in ("mean", "cls"):
            raise VitscopeValueError(f"pooling must be 'mean' or 'cls', got '{pooling}'")
        spec = backbone.spec
        if pooling == "cls" and "cls" not in spec.prefix_kinds:
            raise VitscopeValueError(f"{spec.name} has no CLS token; use pooling='mean'")
        self.backbone_model = backbone.model  # registered, so fine-tuning and state_dict see it
        self._backbone = backbone
        self.pooling, self.freeze, self.embedding_size = pooling, freeze_backbone, embedding_size
        dim = spec.embed_dim
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.projection = nn.Linear(dim, embedding_size)
        if freeze_backbone:
            for p in self.backbone_model.parameters():
                p.requires_grad_(False)

    def settings(self) -> dict[str, Any]:
        """What decides this net's numbers beyond its weights (a training run's checkpoint key covers it)."""
        return {"pooling": self.pooling, "embedding_size": self.embedding_size, "freeze_backbone": self.freeze}

    def train(self, mode: bool = True) -> EmbeddingNet:
        super().train(mode)
        if self.freeze:
            self.backbone_model.eval()  # frozen batch-norm statistics and no dropout
        return self

    def pooled(self, pixels: torch.Tensor) -> torch.Tensor:
        """``[B, 3, H, W]`` -> pooled backbone features ``[B, D]`` (before the projection)."""
        b = self._backbone
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.freeze):
            out = b.final_norm(b.run_blocks(b.embed(pixels), 0, b.spec.num_blocks))
        if out.dim() == 4:  # CNN map [B, C, h, w]
            return out.mean(dim=(2, 3))
        return out[:, 0] if self.pooling == "cls" else out[:, b.spec.num_prefix_tokens:].mean(1)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """``[B, 3, H, W]`` normalised pixels -> embeddings ``[B, E]``."""
        return self.projection(self.pooled(pixels))


def train_embedding(
    backbone: Backbone,
    data: str | os.PathLike | TensorImages,
    steps: int = 500,
    batch_size: int = 64,
    embedding_size: int = 128,
    pooling: str = "mean",
    freeze_backbone: bool = True,
    config: MetricConfig = MetricConfig(),
    checkpoint_dir: str | os.PathLike | None = None,
    seed: int = 0,
    progress: bool | None = None,
) -> EmbeddingNet:
    """Train an embedding head with a metric-learning loss on an ImageFolder (class = identity).

    Args:
        backbone: the network to embed with.
        data: an ImageFolder root (``root/<identity>/<image>``) or images already in memory.
        steps, batch_size: optimisation length.
        embedding_size, pooling, freeze_backbone: see :class:`EmbeddingNet`.
        config: loss (Proxy-Anchor or ArcFace) and SGD one-cycle settings.
        checkpoint_dir: keep resumable state here (re-running resumes).
        seed: batch order and augmentations.
        progress: progress bar (default: when stderr is a terminal).

    Returns:
        The trained :class:`EmbeddingNet` in eval mode.
    """
    images = data if isinstance(data, TensorImages) else image_folder_tensors(data, backbone.spec)
    if len(torch.unique(images.labels)) < 2:
        raise VitscopeValueError("metric learning needs images of at least 2 identities (classes), got 1")
    net = EmbeddingNet(backbone, embedding_size, pooling, freeze_backbone, seed)
    recipe = MetricRecipe(backbone, images.num_classes, config, embedder=net)
    fit(recipe, images, LoopConfig(steps=steps, batch_size=min(batch_size, len(images)), seed=seed,
                                   checkpoint_dir=checkpoint_dir, progress=progress))
    return net.eval()
