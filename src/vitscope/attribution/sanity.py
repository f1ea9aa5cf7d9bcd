"""The model-randomisation sanity check (Adebayo et al. 2018, "Sanity Checks for Saliency Maps"): the weights are
randomised cascading from the top (the classifier head, then the last block, down to the first), and each map is
compared with the trained model's by Spearman rank correlation. A map that barely changes while the model it
explains is destroyed does not explain the model; the check says so."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from vitscope.errors import VitscopeTypeError
from vitscope.models.backbone import Backbone

__all__ = ["Sanity", "cascading_randomisation"]


@dataclass
class Sanity:
    """Spearman correlations of the maps with the trained model's after each randomisation step.

    Attributes:
        steps: what had been randomised at each step (``"head"``, ``"block 5"``, ... cumulative, top down).
        correlation: ``[steps, B]`` Spearman rank correlation of every image's map with the trained one.
        threshold: the mean correlation at the last step above which the method fails the check.
    """

    steps: list[str]
    correlation: torch.Tensor
    threshold: float

    @property
    def final(self) -> float:
        """The mean correlation once every block is random."""
        return float(self.correlation[-1].nanmean())

    @property
    def passes(self) -> bool:
        """Whether the maps of the fully randomised model differ from the trained one's (mean rank correlation at
        most ``threshold``)."""
        return self.final <= self.threshold


def _spearman(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    from scipy.stats import spearmanr

    out = []
    for x, y in zip(a.reshape(a.shape[0], -1).double().numpy(), b.reshape(b.shape[0], -1).double().numpy()):
        out.append(spearmanr(x, y).statistic if np.ptp(x) > 0 and np.ptp(y) > 0 else np.nan)
    return torch.as_tensor(np.asarray(out, dtype=np.float64))


def _randomised(module: torch.nn.Module, generator: torch.Generator) -> None:
    """Every parameter of ``module`` redrawn from a Gaussian of its own mean and standard deviation."""
    with torch.no_grad():
        for p in module.parameters():
            mean, std = float(p.float().mean()), float(p.float().std()) if p.numel() > 1 else 0.0
            p.copy_((torch.randn(p.shape, generator=generator) * (std or 0.02) + mean).to(p.dtype))


def cascading_randomisation(backbone: Backbone, explain: Callable[[Backbone], torch.Tensor], seed: int = 0,
                            threshold: float = 0.5) -> Sanity:
    """Randomise a copy of ``backbone`` top down and correlate ``explain``'s maps with the trained model's.

    Args:
        backbone: the trained model (left untouched: a copy is randomised).
        explain: ``backbone -> maps [B, ...]`` (e.g. ``lambda b: attribute(b, pixels, target, "chefer")``).
        seed: of the random weights.
        threshold: the mean Spearman correlation at the last step above which the method fails.
    """
    blocks = getattr(backbone, "layers", None) or getattr(backbone.model, "blocks", None)
    if blocks is None:
        raise VitscopeTypeError(f"{type(backbone).__name__}: the cascading randomisation needs a transformer's blocks")
    trained = explain(backbone).detach().cpu()
    twin = copy.deepcopy(backbone)
    twin_blocks = getattr(twin, "layers", None) or getattr(twin.model, "blocks", None)
    generator = torch.Generator().manual_seed(seed)
    steps, correlations = [], []
    head = getattr(twin.model, "classifier", None) or getattr(twin.model, "head", None)
    if isinstance(head, torch.nn.Module) and any(True for _ in head.parameters()):
        _randomised(head, generator)
        steps.append("head")
        correlations.append(_spearman(explain(twin).detach().cpu(), trained))
    for i in reversed(range(len(twin_blocks))):
        _randomised(twin_blocks[i], generator)
        steps.append(f"block {i}")
        correlations.append(_spearman(explain(twin).detach().cpu(), trained))
    return Sanity(steps, torch.stack(correlations), float(threshold))
