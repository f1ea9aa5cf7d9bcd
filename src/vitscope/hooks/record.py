"""The dict-like record a recording context yields, and the handle bookkeeping behind it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

import torch

from vitscope.errors import VitscopeKeyError
from vitscope.hooks.names import UnknownHookError


class Removable(Protocol):
    def remove(self) -> None: ...


class CallbackRemovable:
    """Wraps a clean-up function so it sits in the same list as torch hook handles."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self._fn: Callable[[], None] | None = fn

    def remove(self) -> None:
        if self._fn is not None:
            fn, self._fn = self._fn, None
            fn()


class Record(Mapping[str, torch.Tensor]):
    """Latest tensor of every requested hook name (each forward overwrites the previous one).

    Attributes:
        names: the resolved canonical names this record was asked for.
        detach: whether tensors are stored detached from the autograd graph.
    """

    def __init__(self, names: list[str], detach: bool = True) -> None:
        self.names: tuple[str, ...] = tuple(names)
        self._wanted = frozenset(names)
        self.detach = detach
        self._data: dict[str, torch.Tensor] = {}
        self._paused = False
        self._reducer: Callable[[str, torch.Tensor], None] | None = None
        self._reduced: frozenset[str] = frozenset()
        self._kept: frozenset[str] = frozenset()

    def wants(self, name: str) -> bool:
        return name in self._wanted and not self._paused

    def put(self, name: str, tensor: torch.Tensor) -> None:
        """Store ``tensor`` under ``name`` if it was requested (adapters call this from hooks)."""
        if name in self._wanted and not self._paused:
            tensor = tensor.detach() if self.detach else tensor
            if name in self._reduced:
                assert self._reducer is not None
                self._reducer(name, tensor)
                if name not in self._kept:  # only its shape stays: the memory goes back now
                    tensor = torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")
            self._data[name] = tensor

    @contextlib.contextmanager
    def reducing(self, names: frozenset[str], reducer: Callable[[str, torch.Tensor], None],
                 keep: frozenset[str] = frozenset()) -> Iterator[None]:
        """Hand each of ``names`` to ``reducer(name, tensor)`` the moment it is recorded, and keep in the record
        only a tensor of the same shape on the ``meta`` device (no storage), except for the names in ``keep``.

        The engine uses it to reduce every block's attention pattern as the model produces it, so one block's
        pattern is alive at a time instead of every block's.
        """
        before = (self._reducer, self._reduced, self._kept)
        self._reducer, self._reduced, self._kept = reducer, frozenset(names), frozenset(keep)
        try:
            yield
        finally:
            self._reducer, self._reduced, self._kept = before

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Record nothing inside (extra forwards of an analysis leave the batch's record as it is)."""
        before, self._paused = self._paused, True
        try:
            yield
        finally:
            self._paused = before

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._wanted:
            raise UnknownHookError(f"'{name}' was not requested in this recording; requested: {', '.join(self.names)}")
        if name not in self._data:
            raise VitscopeKeyError(f"'{name}' has not been recorded yet: run a forward pass inside the context")
        return self._data[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def clear(self) -> None:
        self._data.clear()

    def as_dict(self) -> dict[str, torch.Tensor]:
        return dict(self._data)

