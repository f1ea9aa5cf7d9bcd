"""The edits of an intervention (``backbone.intervene``): a function per canonical hook name, applied where the
model makes that tensor, and checked so that a wrong edit fails in one line instead of deep in the model."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar

import torch

from vitscope.errors import VitscopeValueError

__all__ = ["ChainedEdits", "EditError", "EditFn", "EditSet", "Edits", "images_running", "running_images",
           "tiles_running"]

_IMAGES: ContextVar[tuple[int, ...] | None] = ContextVar("vitscope_images_running", default=None)
_TILES: ContextVar[tuple[int, ...] | None] = ContextVar("vitscope_tiles_running", default=None)


@contextlib.contextmanager
def running_images(indices: Sequence[int], tiles: Sequence[int] | None = None) -> Iterator[None]:
    """Say which images (their dataset indices, in batch order) the model runs on inside the block: ``vitscope.run``
    does for every batch, so an edit that takes another image's tensors can choose that image by index, and no
    number depends on the batch.

    Args:
        indices: each row's dataset index; the tiles of a tiled view repeat their image's.
        tiles: each row's tile of its image (0, 1, ...), where a view cuts images into tiles; None: one row an image.
    """
    token = _IMAGES.set(tuple(int(i) for i in indices))
    tile_token = _TILES.set(tuple(int(t) for t in tiles) if tiles is not None else None)
    try:
        yield
    finally:
        _TILES.reset(tile_token)
        _IMAGES.reset(token)


def images_running() -> tuple[int, ...] | None:
    """The dataset indices of the images of the forward under way (:func:`running_images`), or None."""
    return _IMAGES.get()


def tiles_running() -> tuple[int, ...] | None:
    """Each row's tile of its image in the forward under way (:func:`running_images`), or None (a row an image)."""
    return _TILES.get()

#: ``fn(tensor, name) -> tensor``: ``name`` is the resolved canonical name; return the tensor itself to change nothing
EditFn = Callable[[torch.Tensor, str], torch.Tensor]


def _then(first: EditFn, second: EditFn) -> EditFn:
    return lambda t, name: second(first(t, name), name)


class EditSet(dict):
    """``{hook: fn(tensor, name) -> tensor}`` as every ready-made edit returns it; ``a | b`` keeps both where they
    name the same hook (``a``'s edit first, then ``b``'s on its result), where a plain dict would keep ``b``'s."""

    def __or__(self, other: Mapping[str, EditFn]) -> EditSet:  # type: ignore[override]
        if not isinstance(other, Mapping):
            return NotImplemented
        out = EditSet(self)
        for name, fn in other.items():
            out[name] = _then(out[name], fn) if name in out else fn
        return out

    def __ror__(self, other: Mapping[str, EditFn]) -> EditSet:  # type: ignore[override]
        if not isinstance(other, Mapping):
            return NotImplemented
        return EditSet(other) | self


class EditError(VitscopeValueError):
    """An edit returned something the model cannot take in place of the tensor it was given."""


class Edits:
    """Resolved canonical name -> edit function.

    Args:
        fns: every name the intervention edits, resolved (no glob patterns).
    """

    def __init__(self, fns: Mapping[str, EditFn]) -> None:
        self.fns = dict(fns)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.fns)

    def wants(self, name: str) -> bool:
        return name in self.fns

    def apply(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` after the edit of ``name`` (``tensor`` itself when ``name`` has none, or when the edit returns
        its input unchanged: the model then runs exactly as without the intervention).

        Raises:
            EditError: the edit returned no tensor, or one of another shape.
        """
        fn = self.fns.get(name)
        if fn is None:
            return tensor
        out = fn(tensor, name)
        if out is tensor:
            return tensor
        if not isinstance(out, torch.Tensor):
            raise EditError(f"the edit of '{name}' returned {type(out).__name__}, not a tensor")
        if out.shape != tensor.shape:
            raise EditError(f"the edit of '{name}' returned shape {tuple(out.shape)}; it must keep the shape "
                            f"{tuple(tensor.shape)} of the tensor it was given")
        return out.to(device=tensor.device, dtype=tensor.dtype)


class ChainedEdits(Edits):
    """The edits of nested interventions, applied one after the other where each names the same tensor, outermost
    first: what the model runs while several ``backbone.intervene`` contexts are open (one set of hooks, so the
    order is the same on every family and at every site).

    Args:
        parts: the open interventions' edits, outermost first.
    """

    def __init__(self, parts: Sequence[Edits]) -> None:
        super().__init__({name: fn for part in parts for name, fn in part.fns.items()})
        self.parts = tuple(parts)

    def apply(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        for part in self.parts:
            tensor = part.apply(name, tensor)
        return tensor
