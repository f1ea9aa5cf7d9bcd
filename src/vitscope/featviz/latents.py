"""Feature visualisations of sparse autoencoder latents: the image that maximises the projection of a hook's
spatial tokens on a latent's encoder direction."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vitscope.autoencoders.model import SparseAutoencoder
from vitscope.featviz.objectives import Direction
from vitscope.featviz.render import FeatvizConfig, render
from vitscope.models.backbone import Backbone

__all__ = ["latent_pictures"]


def latent_pictures(backbone: Backbone, sae: SparseAutoencoder, hook: str, latents: Sequence[int], steps: int,
                    side: int = 96, seed: int = 0) -> torch.Tensor:
    """One optimised image per latent, maximising the mean projection of ``hook``'s spatial tokens on the latent's
    encoder direction (:class:`~vitscope.featviz.objectives.Direction`, the published recipe's augmentations).

    Args:
        backbone: the model the SAE reads; sae: the autoencoder; hook: where it reads.
        latents: the latent ids; steps: optimisation steps; side: pixels of the returned pictures; seed: of the
            initial pixels and augmentations.

    Returns:
        ``[U, side, side, 3]`` uint8.
    """
    objectives = [Direction(hook, sae.encoder_direction(int(c)), label=f"latent{int(c)}") for c in latents]
    found = render(backbone, objectives, FeatvizConfig(steps=int(steps), seed=seed))
    small = torch.nn.functional.interpolate(found.images.clamp(0, 1), size=(side, side), mode="area")
    return (small * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous()
