"""Linear probe on frozen features (docs/methods.md, Probes per block; paper 002 appendix E.4), plain torch.

No I/O, no plotting, no global state: the seed goes into a private ``torch.Generator`` used for the
initialisation and the shuffling, so the same seed gives the same probe (on one device and torch
build). Logistic regression = one ``nn.Linear`` trained with cross-entropy; with ``batch_norm=True`` a
``BatchNorm1d(affine=False)`` comes first, as MAE's linear-probe recipe (paper 002 rows 4 and 5).
Optimiser: Adam with a cosine learning-rate schedule over ``epochs`` passes of minibatches.

The probe without batch norm trains on the features standardised by the training set's mean and deviation, and
the standardisation is folded into the linear layer it returns (a linear classifier of the raw features, as
before): without it a feature offset common to every image (residual streams with massive activations) leaves
Adam's steps far too large for the logits, and on a few hundred images 20 epochs end at chance where logistic
regression separates the classes. The batch norm's statistics at evaluation are the average over every training
minibatch (``momentum=None``), not a moving average that a short training leaves far from them.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from vitscope.errors import VitscopeValueError

__all__ = ["linear_probe_accuracy", "train_linear_probe"]


def _xy(x: torch.Tensor, y: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise VitscopeValueError(f"{name} features must be a torch.Tensor [n, d], got {getattr(x, 'shape', type(x))}")
    y = torch.as_tensor(y).reshape(-1)
    if y.dtype.is_floating_point or y.dtype == torch.bool:
        raise VitscopeValueError(f"{name} labels must be integers, got dtype {y.dtype}")
    if y.numel() != x.shape[0]:
        raise VitscopeValueError(f"{name}: {y.numel()} labels for {x.shape[0]} feature rows")
    x = x.detach().float().cpu()
    return (x.clone() if x.is_inference() else x), y.long().cpu()  # inference tensors cannot enter autograd


_SMALL = 1 << 22  # elements of a minibatch x classes below which one thread is faster


@contextlib.contextmanager
def _threads_for(work: int) -> Iterator[None]:
    """One intra-op thread for small problems, restored afterwards.

    Hundreds of tiny optimisation steps gain nothing from OpenMP, and on a busy machine each parallel region
    waits for a descheduled worker: training measured 100x slower with 2 threads than with 1 under load.
    """
    before = torch.get_num_threads()
    if work < _SMALL and before > 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_linear_probe(
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int | None = None,
    batch_norm: bool = False,
    epochs: int = 20,
    batch_size: int = 256,
    lr: float = 0.1,
    weight_decay: float = 0.0,
    seed: int = 0,
) -> nn.Module:
    """Train a linear classifier on fixed features (on the CPU, float32).

    Args:
        x: ``[n, d]`` training features.
        y: ``[n]`` integer labels in ``[0, num_classes)``.
        num_classes: default ``max(y) + 1``.
        batch_norm: put ``BatchNorm1d(d, affine=False)`` before the linear layer.
        epochs: passes over the data (paper 002: 20).
        batch_size: minibatch size.
        lr: peak Adam learning rate (cosine decay to 0 over all steps).
        weight_decay: L2 penalty (Adam's ``weight_decay``).
        seed: seeds the initialisation and the shuffling.

    Returns:
        The trained probe in eval mode (``probe(x) -> logits [n, num_classes]``).
    """
    x, y = _xy(x, y, "training")
    if x.shape[0] == 0:
        raise VitscopeValueError("a linear probe needs at least one training example")
    if int(y.min()) < 0:
        raise VitscopeValueError("labels must be >= 0")
    num_classes = int(y.max()) + 1 if num_classes is None else int(num_classes)
    if int(y.max()) >= num_classes:
        raise VitscopeValueError(f"labels go up to {int(y.max())}, beyond num_classes={num_classes}")
    if epochs < 1 or batch_size < 1:
        raise VitscopeValueError(f"epochs and batch_size must be >= 1, got {epochs} and {batch_size}")
    gen = torch.Generator().manual_seed(int(seed))
    linear = nn.Linear(x.shape[1], num_classes)
    with torch.no_grad():  # seeded init (nn.Linear's own init draws from the global generator)
        bound = 1.0 / math.sqrt(x.shape[1])
        linear.weight.uniform_(-bound, bound, generator=gen)
        linear.bias.zero_()
    if batch_norm:
        probe: nn.Module = nn.Sequential(nn.BatchNorm1d(x.shape[1], affine=False, eps=1e-6, momentum=None), linear)
        inputs = x
    else:
        probe, (inputs, centre, scale) = linear, _standardised(x)
    optimiser = torch.optim.Adam(probe.parameters(), lr=lr, weight_decay=weight_decay)
    steps_per_epoch = math.ceil(x.shape[0] / batch_size)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, T_max=epochs * steps_per_epoch)
    probe.train()
    with torch.enable_grad(), _threads_for(min(batch_size, x.shape[0]) * x.shape[1] * num_classes):
        for _ in range(epochs):
            order = torch.randperm(x.shape[0], generator=gen)
            for start in range(0, x.shape[0], batch_size):
                idx = order[start : start + batch_size]
                if batch_norm and idx.numel() < 2:
                    continue  # batch norm cannot train on a single example
                loss = F.cross_entropy(probe(inputs[idx]), y[idx])
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                schedule.step()
    if not batch_norm:  # the standardisation folded in: logits of the raw features
        with torch.no_grad():
            linear.weight.div_(scale)
            linear.bias.sub_(linear.weight @ centre)
    return probe.eval()


def _standardised(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x [n, d]`` standardised per feature, with its ``centre [d]`` and ``scale [d]`` (a constant feature
    keeps scale 1)."""
    centre = x.mean(dim=0)
    scale = x.std(dim=0, unbiased=False)
    scale = torch.where(scale > 1e-12 * scale.max().clamp_min(1e-30), scale, torch.ones_like(scale))
    return (x - centre) / scale, centre, scale


def linear_probe_accuracy(
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    test_x: torch.Tensor,
    test_y: torch.Tensor,
    **kwargs: object,
) -> float:
    """Top-1 accuracy on ``(test_x, test_y)`` of a probe trained on ``(train_x, train_y)``.

    Args:
        train_x: ``[n, d]`` training features; train_y: ``[n]`` labels.
        test_x: ``[m, d]`` test features; test_y: ``[m]`` labels.
        **kwargs: options of :func:`train_linear_probe` (``batch_norm``, ``epochs``, ``lr``, ``seed``...).

    Returns:
        Accuracy in [0, 1]; NaN when there is no test example.
    """
    test_x, test_y = _xy(test_x, test_y, "test")
    if test_x.shape[0] == 0:
        return math.nan
    train_x, train_y = _xy(train_x, train_y, "training")
    num_classes = int(max(int(train_y.max()), int(test_y.max()))) + 1
    probe = train_linear_probe(train_x, train_y, num_classes=num_classes, **kwargs)  # type: ignore[arg-type]
    with torch.no_grad():
        pred = probe(test_x).argmax(dim=1)
    return float((pred == test_y).double().mean())
