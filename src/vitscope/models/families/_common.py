"""What several families share: the preprocessing of the papers' checkpoints, and the pooling of classifiers
that read every token (SigLIP and SigLIP 2 have no CLS token)."""

from __future__ import annotations

from typing import Any

import torch

from vitscope.models.family import IMAGENET

#: DINO, DINOv2, MAE and DeiT evaluation: resize 256, centre crop 224, bicubic, ImageNet statistics, rounded as
#: the torchvision Resize and CenterCrop of their code round (the crop's offsets rounded, not floored)
DINO = {**IMAGENET, "image_size": (224, 224), "resize_size": 256, "interpolation": "bicubic",
        "resize_rule": "torchvision"}
#: Inception-style statistics of the original ViT and BEiT checkpoints
INCEPTION = {"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "image_size": (224, 224), "resize_size": 224,
             "interpolation": "bilinear"}
#: OpenAI CLIP's preprocessing: torchvision's Resize(224) and CenterCrop(224), bicubic, CLIP's statistics
CLIP = {"mean": (0.48145466, 0.4578275, 0.40821073), "std": (0.26862954, 0.26130258, 0.27577711),
        "image_size": (224, 224), "resize_size": 224, "interpolation": "bicubic", "resize_rule": "torchvision"}


def vision_config_of(config: Any) -> Any:
    """The vision config of a whole image-text checkpoint, with the image projection's width
    (``projection_dim``), which transformers keeps in the top-level config only (a vision tower loaded with its
    projection would otherwise expect transformers' default 512 and refuse CLIP-L/14's 768)."""
    import copy

    vision = copy.deepcopy(config.vision_config)
    if getattr(config, "projection_dim", None) is not None:
        vision.projection_dim = config.projection_dim
    return vision


def mean_token_head(backbone: Any, tokens: torch.Tensor) -> torch.Tensor:
    """The classifier on the mean of every token (a model without prefix tokens; no padding token exists)."""
    return backbone.model.classifier(tokens.mean(dim=1))
