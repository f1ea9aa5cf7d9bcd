"""A forward pass in ``torch.inference_mode`` that leaves the model as it found it, usable for gradients.

Hugging Face models keep some per-grid tensors in ``functools.lru_cache`` caches on their module classes (BEiT's
relative position index, through transformers' ``compile_compatible_method_lru_cache``). A tensor made inside
inference mode is an inference tensor: cached, it is reused by a later forward with autograd (an attribution,
feature visualisation, the user's own fine-tuning), which then fails ("Inference tensors cannot be saved for
backward"). The caches are cleared when the pass ends; they refill on the next forward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

__all__ = ["forget_cached_tensors", "inference_pass"]


@contextlib.contextmanager
def inference_pass(model: nn.Module) -> Iterator[None]:
    """``torch.inference_mode`` for a pass over ``model`` in eval mode; on the way out every module is back in the
    mode it was in (a model being trained keeps its dropout, its frozen parts stay in eval mode) and its classes'
    caches are cleared."""
    modes = [(m, m.training) for m in model.modules()]  # each its own: a frozen part of a trained model stays eval
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        for module, training in modes:
            module.training = training
        forget_cached_tensors(model)


def forget_cached_tensors(model: nn.Module) -> int:
    """Clear the ``lru_cache`` caches of the classes of ``model``'s modules; returns how many were cleared.

    A cache is found on a class attribute (a function, static or class method) or in the closure of the wrapper
    transformers puts around it (the wrapper itself has no ``cache_clear``).
    """
    cleared = 0
    for cls in {type(m) for m in model.modules()}:
        for attr in vars(cls).values():
            fn = attr.__func__ if isinstance(attr, (staticmethod, classmethod)) else attr
            cells = getattr(fn, "__closure__", None) or ()
            for cache in (fn, *(c.cell_contents for c in cells if _filled(c))):
                if callable(getattr(cache, "cache_clear", None)):
                    cache.cache_clear()
                    cleared += 1
    return cleared


def _filled(cell: object) -> bool:
    """Whether a closure cell holds a value (an empty one raises on reading)."""
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True
