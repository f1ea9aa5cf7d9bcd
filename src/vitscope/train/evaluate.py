"""Held-out scores of trained models: k-NN accuracy, classifier accuracy, Recall@1, and raw-pixel baselines."""

from __future__ import annotations

import torch

from vitscope.errors import VitscopeValueError
from vitscope.functional import knn_classify, recall_at_k_map_at_r
from vitscope.models.backbone import Backbone
from vitscope.train.data import normalise

__all__ = ["FEATURES", "classifier_accuracy", "extract", "knn_accuracy", "pixel_features", "recall_at_1"]

FEATURES = ("cls", "mean", "output")


@torch.no_grad()
def extract(backbone: Backbone, images: torch.Tensor, features: str = "cls", batch_size: int = 256) -> torch.Tensor:
    """Features of ``images`` (uint8 ``[N, 3, H, W]`` at the model's input size) -> ``[N, d]`` float32.

    Args:
        backbone: the model (put in eval mode).
        images: the images, already at the model's resolution.
        features: ``"cls"`` (final-norm CLS token), ``"mean"`` (final-norm spatial tokens averaged) or
            ``"output"`` (the model's own output: logits, or the embedding of a metric model).
        batch_size: images per forward pass.
    """
    if features not in FEATURES:
        raise VitscopeValueError(f"unknown features '{features}'; choose one of {', '.join(FEATURES)}")
    spec = backbone.spec
    backbone.model.eval()
    out = []
    for i in range(0, len(images), batch_size):
        x = normalise(images[i:i + batch_size], spec.mean, spec.std)
        if features == "output":
            out.append(backbone(x).float())
            continue
        tokens = backbone.final_norm(backbone.run_blocks(backbone.embed(x), 0, spec.num_blocks))
        p = spec.num_prefix_tokens
        out.append(tokens[:, 0] if features == "cls" else tokens[:, p:].mean(1))
    return torch.cat(out).float()


def pixel_features(images: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """Raw-pixel baseline features: the normalised image flattened, ``[N, 3*H*W]``."""
    return normalise(images, mean, std).flatten(1)


def knn_accuracy(bank: torch.Tensor, bank_labels: torch.Tensor, test: torch.Tensor, test_labels: torch.Tensor,
                 k: int = 20, temperature: float = 0.07) -> float:
    """Weighted k-NN accuracy (DINO's protocol, docs/methods.md, Probes per block) of ``test`` against ``bank``."""
    pred = knn_classify(bank, bank_labels, test, k=k, temperature=temperature)
    return float((pred.cpu() == test_labels.cpu()).double().mean())


def classifier_accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Top-1 accuracy of ``logits [N, C]``."""
    return float((logits.argmax(-1).cpu() == labels.cpu()).double().mean())


def recall_at_1(embeddings: torch.Tensor, labels: torch.Tensor) -> float:
    """Leave-one-out Recall@1 with cosine similarity (paper 000's retrieval metric)."""
    return float(recall_at_k_map_at_r(embeddings, labels, ks=(1,))["R@1"])


