"""Functions run through ``torch.compile``, falling back to themselves where it cannot compile.

The shared attention pass reads every block's ``[B, H, N, N]`` pattern for a dozen reductions. Run op by op, each
reduction and each elementwise step is one pass over the pattern in memory (about thirty per block), which is what
bounds it on a GPU; compiled, the steps fuse into a few kernels that read the pattern a few times. The numbers
then differ from the op-by-op ones by float32 rounding (sums in another order), so callers make it an option.

One compiled function is kept per (function, static arguments), with the first (batch) dimension dynamic, so the
last, smaller batch and the groups of images at high token counts do not compile again.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Hashable, Iterator
from contextvars import ContextVar
from typing import Any

import torch

__all__ = ["BACKEND", "CompileFallbackWarning", "compiled_call", "watch_fallbacks"]

#: the ``torch.compile`` backend: inductor fuses (C++ on CPUs, Triton on GPUs); the suite traces with
#: ``aot_eager`` to keep its minutes, ``make compile-check`` runs inductor
BACKEND = "inductor"


class CompileFallbackWarning(UserWarning):
    """``torch.compile`` failed on this machine, so the function runs op by op (same maths, slower)."""


#: inside :func:`watch_fallbacks`: function name -> why it ran op by op
_OP_BY_OP: ContextVar[dict[str, str] | None] = ContextVar("vitscope_op_by_op", default=None)


@contextlib.contextmanager
def watch_fallbacks() -> Iterator[dict[str, str]]:
    """Collect, for the block, the compiled functions that ran op by op instead (name -> why): a pass asked to
    compile says what ran (a function stays op by op for the process once compiling it has failed)."""
    token = _OP_BY_OP.set({})
    try:
        yield _OP_BY_OP.get()
    finally:
        _OP_BY_OP.reset(token)


class _Compiled:
    """``fn(x, *static)`` compiled for tensors ``x``; the plain ``fn`` once compiling has failed."""

    def __init__(self, fn: Callable[..., Any], static: tuple[tuple[str, Hashable], ...]) -> None:
        self.fn = fn
        self.static = dict(static)
        self.reason = ""
        try:
            self.compiled: Callable[..., Any] | None = torch.compile(functools.partial(fn, **self.static),
                                                                     backend=BACKEND)
        except Exception as err:  # torch.compile itself unavailable (an unsupported Python, say)
            self._fall_back(err)

    def __call__(self, x: torch.Tensor) -> Any:
        if self.compiled is not None:
            torch._dynamo.maybe_mark_dynamic(x, 0)  # every batch size with one compilation
            try:
                return self.compiled(x)
            except Exception as err:  # a compiler the machine lacks, an unsupported device: the plain maths
                self._fall_back(err)
        watched = _OP_BY_OP.get()
        if watched is not None:
            watched[self.fn.__name__] = self.reason
        return self.fn(x, **self.static)

    def _fall_back(self, err: Exception) -> None:
        self.compiled = None
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        self.reason = f"{type(err).__name__}: {first}"
        warnings.warn(f"torch.compile could not compile {self.fn.__name__} ({type(err).__name__}: {first}); running "
                      "it op by op, which gives the same statistics more slowly", CompileFallbackWarning,
                      stacklevel=4)


_CACHE: dict[tuple[Callable[..., Any], str, tuple[tuple[str, Hashable], ...]], _Compiled] = {}


def compiled_call(fn: Callable[..., Any], **static: Hashable) -> Callable[[torch.Tensor], Any]:
    """``x -> fn(x, **static)`` through ``torch.compile``, one compilation per ``(fn, static)`` in this process.

    Args:
        fn: a function of one tensor (first dimension: the batch) and keyword arguments that stay fixed.
        static: those arguments (hashable; each distinct value compiles anew).

    Returns:
        A callable of the tensor. Where compiling fails it warns once (:class:`CompileFallbackWarning`) and calls
        ``fn`` itself from then on.
    """
    key = (fn, BACKEND, tuple(sorted(static.items())))
    found = _CACHE.get(key)
    if found is None:
        found = _CACHE[key] = _Compiled(fn, key[2])
    return found
