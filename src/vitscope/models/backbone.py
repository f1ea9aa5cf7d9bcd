"""The Backbone: one interface over every model family (docs/architecture.md, "Layers")."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from vitscope.errors import VitscopeTypeError
from vitscope.hooks.edits import ChainedEdits, EditFn, Edits
from vitscope.hooks.names import cnn_hook_names, expand_names, transformer_hook_names
from vitscope.hooks.record import Record, Removable
from vitscope.models.preprocess import preprocess_images
from vitscope.models.spec import ModelSpec


class Backbone(ABC):
    """A model from its own library plus the vitscope vocabulary.

    Subclasses map canonical hook names onto the wrapped model's modules and provide
    staged execution. The wrapped model is never modified outside a recording context.

    Attributes:
        model: the wrapped ``nn.Module``, untouched.
        spec: the frozen ModelSpec.
    """

    #: whether ``head`` takes the output of ``final_norm`` (True) or the last block's output
    head_after_final_norm: bool = True

    def __init__(self, model: nn.Module, spec: ModelSpec) -> None:
        self.model = model
        self.spec = spec

    # -- running -------------------------------------------------------------------------
    def __call__(self, pixels: torch.Tensor, **kwargs: Any) -> Any:
        """Run the wrapped model on ``pixels [B, 3, H, W]`` and return its own output."""
        return self.forward(pixels, **kwargs)

    @abstractmethod
    def forward(self, pixels: torch.Tensor, **kwargs: Any) -> Any: ...

    @property
    def resizable_input(self) -> bool:
        """Whether the model runs at input sizes other than the one it was built for (position embeddings
        interpolated; a CNN runs at any size)."""
        return not self.spec.is_transformer

    @property
    def positions_in_blocks(self) -> bool:
        """Whether the blocks themselves place tokens (rotary position embeddings, DINOv3; BEiT's relative position
        bias): a sequence with spatial tokens left out must then say where the kept ones sit (:meth:`run_kept`); with
        position embeddings added by :meth:`embed`, the kept tokens carry theirs."""
        return False

    def run_kept(self, tokens: torch.Tensor, positions: torch.Tensor, start: int = 0,
                 stop: int | None = None) -> torch.Tensor:
        """:meth:`run_blocks` on a sequence whose spatial tokens are a subset: ``tokens [B, p + K, D]`` (prefix,
        then the kept spatial tokens), ``positions [B, K]`` their row-major places on the input's grid."""
        return self.run_blocks(tokens, start, stop)

    def grid_at(self, image_size: tuple[int, int]) -> tuple[int, int]:
        """The token grid (CNN: final feature map) of an ``image_size`` input."""
        return self.spec.grid_for(*image_size)

    def preprocess(self, images: Sequence[Any]) -> torch.Tensor:
        """PIL images (or HxWx3 uint8 arrays, or one ``[B, H, W, 3]`` uint8 array) -> ``[B, 3, H, W]`` float32 in the
        model's normalisation (:func:`~vitscope.models.preprocess.preprocess_images`)."""
        return preprocess_images(images, self.spec)

    # -- staged execution ---------------------------------------------------------------
    @abstractmethod
    def embed(self, pixels: torch.Tensor) -> torch.Tensor:
        """``[B, 3, H, W] -> [B, N, D]`` tokens entering block 0 (CNN: the stem's map)."""

    @abstractmethod
    def run_blocks(self, tokens: torch.Tensor, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Run blocks ``start .. stop-1`` on ``tokens [B, N, D]`` (CNN: stages on ``[B, C, h, w]``)."""

    @abstractmethod
    def final_norm(self, tokens: torch.Tensor) -> torch.Tensor:
        """The model's final norm applied to every token, ``[B, N, D] -> [B, N, D]``."""

    def head(self, tokens: torch.Tensor) -> torch.Tensor:
        """Classifier logits ``[B, classes]`` from the sequence (see ``head_after_final_norm``)."""
        raise AttributeError(f"{self.spec.name} has no classifier head (spec.has_head is False)")

    # -- recording ----------------------------------------------------------------------
    def hook_names(self) -> list[str]:
        """Every canonical hook name this backbone can record."""
        if self.spec.is_transformer:
            return transformer_hook_names(self.spec.num_blocks)
        return cnn_hook_names(self.spec.num_blocks)

    @contextmanager
    def record(self, names: Sequence[str] | str, detach: bool = True) -> Iterator[Record]:
        """Record the requested hook names during forwards run inside the context.

        Args:
            names: canonical names or glob patterns (``"blocks.*.attn.pattern"``).
            detach: store tensors detached (set False to backpropagate through them).

        Yields:
            A :class:`Record`; ``rec[name]`` is the tensor of the latest forward.

        Raises:
            UnknownHookError: a name matches nothing; the message lists valid names.
        """
        resolved = expand_names(names, self.hook_names(), self.spec.name)
        rec = Record(resolved, detach=detach)
        handles: list[Removable] = []
        try:
            handles = self._install(rec)
            yield rec
        finally:
            for handle in reversed(handles):
                handle.remove()

    @abstractmethod
    def _install(self, rec: Record) -> list[Removable]:
        """Register the hooks that fill ``rec``; return everything that must be removed."""

    # -- interventions ------------------------------------------------------------------
    @contextmanager
    def intervene(self, edits: Mapping[str, EditFn]) -> Iterator[None]:
        """Run the model with ``fn(tensor, name) -> tensor`` applied where it makes each named tensor.

        Args:
            edits: canonical names or glob patterns (``"blocks.*.attn.heads"``) -> edit function; ``name`` is the
                resolved canonical name; where two entries name one tensor the later one's edit is applied (to
                apply both, combine them with ``|``: :class:`~vitscope.interventions.EditSet`). An edit returning
                its input unchanged leaves the model exactly as it is.
                Editing ``blocks.{i}.attn.pattern`` makes that block run vitscope's eager-equivalent kernel with
                the edited pattern multiplying the values (not renormalised); editing ``attn.q|k|v`` changes the
                pattern accordingly. A recording opened inside or around the context sees the edited tensors.
                Contexts nest: where several edit one tensor, the outermost context's edit applies first and
                each inner one edits its result, on every family and at every site.

        Raises:
            UnknownHookError: a name matches nothing; the message lists valid names.
            EditError: an edit returns no tensor or another shape (raised by the forward).

        The model is left exactly as it was when the context ends, also when an edit or the forward raises.

        Example::

            with backbone.intervene({"blocks.3.attn.heads": lambda t, name: t * 0}):
                logits = backbone(pixels).logits
        """
        resolved: dict[str, EditFn] = {}
        for pattern, fn in edits.items():
            if not callable(fn):
                raise VitscopeTypeError(f"the edit of '{pattern}' must be a function fn(tensor, name) -> tensor, "
                                        f"got {type(fn).__name__}")
            for name in expand_names([pattern], self.hook_names(), self.spec.name):
                resolved[name] = fn
        installed = Edits(resolved)
        open_edits = self.__dict__.setdefault("_open_edits", [])
        if not resolved:  # an empty intervention leaves the model as it is (a model without any still says so)
            for handle in reversed(self._install_edits(installed)):
                handle.remove()
            yield
            return
        open_edits.append(installed)
        try:
            self._reinstall_edits(open_edits)
            yield
        finally:
            open_edits.remove(installed)
            self._reinstall_edits(open_edits)

    def _reinstall_edits(self, open_edits: list[Edits]) -> None:
        """Hooks for every open intervention as one: nested contexts' edits of a tensor apply outermost first
        (:class:`~vitscope.hooks.edits.ChainedEdits`), whatever the family and site; installed anew whenever a
        context opens or closes, ahead of the recordings open then."""
        for handle in reversed(self.__dict__.pop("_edit_handles", [])):
            handle.remove()
        if open_edits:
            chain = open_edits[0] if len(open_edits) == 1 else ChainedEdits(open_edits)
            self.__dict__["_edit_handles"] = self._install_edits(chain)

    @property
    def active_edits(self) -> tuple[Edits, ...]:
        """The edits of every open :meth:`intervene` context, outermost first (empty: the model runs as loaded).

        Edits are functions, so what they compute has no fingerprint: whatever outlives a forward (the feature
        cache) must tell edited runs apart by these objects. Each is a fresh object per context, released when its
        context ends.
        """
        return tuple(self.__dict__.get("_open_edits", ()))

    def _install_edits(self, edits: Edits) -> list[Removable]:
        """Register the hooks that apply ``edits``; return everything that must be removed."""
        raise VitscopeTypeError(f"{type(self).__name__} does not support interventions")

    # -- nn.Module conveniences ---------------------------------------------------------
    def to(self, *args: Any, **kwargs: Any) -> Backbone:
        self.model.to(*args, **kwargs)
        return self

    def eval(self) -> Backbone:
        self.model.eval()
        return self

    def parameters(self) -> Iterator[nn.Parameter]:
        return self.model.parameters()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def __repr__(self) -> str:
        s = self.spec
        return (f"{type(self).__name__}({s.name!r}, family={s.family}, blocks={s.num_blocks}, "
                f"heads={s.num_heads}, dim={s.embed_dim}, patch={s.patch_size}, prefix={s.prefix_kinds})")
