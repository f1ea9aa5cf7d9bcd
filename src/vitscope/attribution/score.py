"""What an attribution explains: a classifier's logit of a class, or an embedding's cosine to a given one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vitscope.errors import VitscopeUsageError, VitscopeValueError
from vitscope.models.backbone import Backbone
from vitscope.models.outputs import embedding_of, embedding_pooling

__all__ = ["POOLINGS", "score_function"]

POOLINGS: tuple[str, ...] = ("cls", "mean")


def score_function(backbone: Backbone, target: Any, batch: int, pooling: str | None = None,
                   projection: Any = None) -> Callable[[Any], torch.Tensor]:
    """``score(model_output_or_tokens) -> [B]``: the logit of ``target`` (an int or ``[B]`` class indices) for a
    classifier, else the cosine of the embedding to ``target`` (``[D]`` or ``[B, D]``).

    The returned function takes the model's output (classifier) or what the embedding is read from (embedding
    model): a transformer's final-normed tokens, a CNN's last feature map
    (:func:`~vitscope.models.outputs.embedding_hook`).

    Raises:
        VitscopeUsageError: a class out of the head's range (a ``VitscopeValueError``).
        VitscopeValueError: a class that is not a whole number, an embedding of the wrong width or number.
    """
    spec = backbone.spec
    if spec.has_head and projection is None:  # a head given as the projection is a metric net's embedding
        classes = _class_indices(target)
        if classes.numel() == 1:
            classes = classes.expand(batch)
        if classes.numel() != batch:
            raise VitscopeValueError(f"target: {classes.numel()} classes for {batch} images; give one class, or "
                                     "one per image")

        def logit(logits: torch.Tensor) -> torch.Tensor:
            bad = classes[(classes < 0) | (classes >= logits.shape[-1])]
            if bad.numel():
                # only the model shows it wrong, as a block it lacks: bad usage
                raise VitscopeUsageError(f"target class {int(bad[0])} is out of range: {spec.name} has "
                                         f"{logits.shape[-1]} classes (0 to {logits.shape[-1] - 1})")
            return logits.gather(1, classes.to(logits.device)[:, None])[:, 0]
        return logit
    if not isinstance(target, torch.Tensor) or not target.is_floating_point():
        raise VitscopeValueError(f"{spec.name} has no classifier head: the target is an embedding [D] or [B, D] to "
                                 "compare with (e.g. another image's), not a class")
    pooling = pooling or embedding_pooling(spec)
    if pooling not in POOLINGS:
        raise VitscopeValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
    wanted = target.reshape(1, -1) if target.dim() == 1 else target
    if wanted.shape[0] not in (1, batch):
        raise VitscopeValueError(f"target: {wanted.shape[0]} embeddings for {batch} images")

    def cosine(tokens: torch.Tensor) -> torch.Tensor:
        emb = embedding_of(backbone, tokens, pooling, projection)
        if emb.shape[-1] != wanted.shape[-1]:
            raise VitscopeValueError(f"the target embedding has width {wanted.shape[-1]}, but {spec.name}'s "
                                     f"embedding has width {emb.shape[-1]}")
        return torch.nn.functional.cosine_similarity(emb, wanted.to(emb.device, emb.dtype), dim=-1)
    cosine.reads = pooling  # type: ignore[attr-defined]  # the token(s) the score reads: the token maps' row
    return cosine


def _class_indices(target: Any) -> torch.Tensor:
    """``target`` as class indices ``[n]`` int64; a float (2.7 would have been cut to 2), a bool or a string is
    refused in one line."""
    try:
        classes = torch.as_tensor(target)
    except (TypeError, ValueError, RuntimeError):
        classes = None
    if classes is None or classes.dtype == torch.bool or classes.is_floating_point() or classes.is_complex():
        shown = repr(target) if len(repr(target)) <= 60 else repr(target)[:57] + "..."
        raise VitscopeValueError(f"target: a classifier's target is a class index (an int, or one per image), got "
                                 f"{shown}")
    return classes.long().reshape(-1)
