"""The analysis protocol (docs/architecture.md, "Declared state"): :class:`Analysis` with declared state, and the
:class:`Result` it returns; the :class:`~vitscope.analyses.batch.Batch` it reads is re-exported here."""

from __future__ import annotations

import copy
import functools
import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from vitscope.analyses.batch import Batch, thumbnails
from vitscope.analyses.data_checks import DataFacts, missing_targets
from vitscope.analyses.result import Figure, Result, as_result
from vitscope.analyses.state import StateSpec, merge_states, on_device
from vitscope.errors import VitscopeKeyError, VitscopeRuntimeError, VitscopeTypeError, VitscopeValueError
from vitscope.models.spec import ModelSpec

__all__ = ["Analysis", "Batch", "Figure", "Result", "thumbnails"]


class Analysis(ABC):
    """A streaming analysis with declared, exactly mergeable state (docs/architecture.md, "Declared state").

    Subclasses call ``super().__init__()`` first, then declare every piece of state with
    :meth:`add_state`, and implement :meth:`required_hooks`, :meth:`update` and :meth:`compute`. Everything
    else comes from this class: :meth:`merge` (``merge(A on x1, A on x2) == A on x1 + x2``), :meth:`reset`,
    :meth:`state_dict` / :meth:`load_state_dict` (resume) and :meth:`sync` (``torch.distributed``). State is
    read and written as plain attributes (``self.total += x``). The arguments an analysis was constructed
    with are kept in :attr:`params` (they key resumable state and label results).

    ``compute()`` returns a :class:`Result`, or a plain dict; :meth:`result` (what the engine and the contract
    tests call) wraps a dict into a Result (tensors and numbers become its tensors, everything else its metadata).

    Example::

        class TokenNorm(vitscope.Analysis):
            def __init__(self):
                super().__init__()
                self.add_state("total", torch.zeros((), dtype=torch.float64), reduce="sum")
                self.add_state("count", torch.zeros((), dtype=torch.float64), reduce="sum")
            def required_hooks(self, spec):
                return ["blocks.0.resid_post"]
            def update(self, record, batch):
                n = record["blocks.0.resid_post"].double().norm(dim=-1)
                self.total += n.sum(); self.count += n.numel()
            def compute(self):
                return {"mean_norm": self.total / self.count}
    """

    name: ClassVar[str] = "analysis"
    #: one paragraph for the report: what the analysis measures and how to read it
    description: ClassVar[str] = ""
    #: one line for ``vitscope analyses`` and ``analyze --help`` (default: the first sentence of the description)
    summary: ClassVar[str] = ""
    #: reads attention patterns (a CNN has none; tiled inputs cannot record them)
    needs_attention: ClassVar[bool] = False
    #: runs on transformers only, without reading attention (their sublayers, say)
    needs_transformer: ClassVar[bool] = False
    #: runs the model again during the pass (``batch.model``): masking, ablations, the logit lens
    reruns_model: ClassVar[bool] = False
    #: reads the model's input pixels (``batch.pixels``): a view that gives none (tiled) is refused before the pass
    needs_pixels: ClassVar[bool] = False
    #: ground-truth keys (``batch.targets``) the default configuration needs, e.g. ``("masks",)``
    required_targets: ClassVar[tuple[str, ...]] = ()
    #: constructor arguments that do not change the numbers (left out of the resume key and merge checks)
    run_only_params: ClassVar[tuple[str, ...]] = ("workdir",)

    def __init__(self) -> None:
        if "_states" not in self.__dict__:
            self._states: dict[str, StateSpec] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is not None and not getattr(init, "_records_params", False):
            cls.__init__ = _recording_params(init)  # type: ignore[method-assign]

    # ------------------------------------------------------------ declared state

    def add_state(self, name: str, default: Any, reduce: str | Callable[[Any, Any], Any] = "sum", **options: Any
                  ) -> None:
        """Declare a piece of state and the rule that merges two copies of it.

        Args:
            name: attribute name (set to a fresh copy of ``default`` now and on every :meth:`reset`).
            default: the empty value: a tensor, number, list, dict, None (shape known at the first batch),
                or a zero-argument factory (e.g. ``RowStore`` for a disk-backed ``"cat"``).
            reduce: ``"sum"``, ``"max"``, ``"min"``, ``"cat"``, ``"mean"`` (with ``count=``), ``"variance"``
                (with ``mean=`` and ``count=``: Chan's formula), ``"topk"`` (with ``key=``, ``k=``, optional
                ``tie=`` and ``dim=``), ``"same"``, or a callable ``(mine, theirs) -> merged``; see
                :mod:`vitscope.analyses.state`.
            options: ``count``, ``mean``, ``key``, ``tie``, ``k``, ``dim`` as the rule needs.

        Raises:
            ValueError: an unknown rule, missing options, or a name already taken.
        """
        if "_states" not in self.__dict__:
            raise VitscopeRuntimeError(f"{type(self).__name__}: call super().__init__() before add_state()")
        if not name.isidentifier() or name.startswith("_") or name in self._states or hasattr(type(self), name):
            raise VitscopeValueError(f"{type(self).__name__}: cannot declare state {name!r} (not an identifier, "
                                     "private, declared twice or the name of a method)")
        spec = StateSpec(name, default, reduce, **options)
        self._states[name] = spec
        setattr(self, name, spec.fresh())

    @property
    def state_names(self) -> tuple[str, ...]:
        """Names of the declared states, in declaration order."""
        return tuple(self._states)

    @property
    def params(self) -> dict[str, Any]:
        """The arguments this analysis was constructed with (defaults filled in)."""
        return dict(self.__dict__.get("_params", {}))

    def keyed_params(self) -> dict[str, Any]:
        """:attr:`params` without :attr:`run_only_params`: what must agree for two states to merge."""
        return {k: v for k, v in self.params.items() if k not in self.run_only_params}

    def reset(self) -> None:
        """Set every declared state back to its default (rows it spilled stay for copies of its state that read
        them: a ``state_dict``, a store ``merge`` extended)."""
        for name, spec in self._states.items():
            setattr(self, name, spec.fresh())

    def release_rows(self) -> None:
        """Delete the rows its disk-backed states spilled into a private temporary folder (a saved state keeps its
        own links to them): once no copy of its state reads them (its result is computed, or its pass failed). The
        states then hold no rows."""
        for name in self._states:
            release = getattr(getattr(self, name), "release", None)
            if callable(release):
                release()

    def states_to_host(self) -> None:
        """Move every tensor of the declared states to the CPU (the engine calls this once after the pass,
        before merging and :meth:`result`, so that updates may keep their sums on the batches' device)."""
        for name in self._states:
            setattr(self, name, on_device(getattr(self, name), "cpu"))

    def state_dict(self) -> dict[str, Any]:
        """Copies of the declared states (plain tensors, numbers, lists, dicts, row stores)."""
        return {name: _copy_value(getattr(self, name)) for name in self._states}

    def load_state_dict(self, state: Mapping[str, Any], copy: bool = True) -> None:
        """Replace the declared states with copies of ``state`` (from :meth:`state_dict`), or with its values
        themselves when ``copy`` is off (a state nothing else holds, such as one just read from a file: row stores
        then keep the files they own, and delete them when done).

        Raises:
            KeyError: ``state`` lacks a declared state or holds an undeclared one.
        """
        missing, extra = sorted(set(self._states) - set(state)), sorted(set(state) - set(self._states))
        if missing or extra:
            problems = ([f"lacks {', '.join(missing)}"] if missing else []) + (
                [f"has undeclared {', '.join(extra)}"] if extra else [])
            raise VitscopeKeyError(f"{self.name}: the saved state {'; '.join(problems)}")
        for name in self._states:
            setattr(self, name, _copy_value(state[name]) if copy else state[name])

    def merge(self, other: Analysis) -> Analysis:
        """Fold ``other``'s state into this one (in place) and return ``self``; ``other`` is unchanged.

        Raises:
            TypeError: ``other`` is another analysis.
            ValueError: it was configured differently, or saw another model geometry.
        """
        if type(other) is not type(self):
            raise VitscopeTypeError(f"cannot merge {type(other).__name__} into {type(self).__name__}")
        if other.keyed_params() != self.keyed_params():
            raise VitscopeValueError(f"cannot merge {self.name} configured with {other.keyed_params()} into one "
                                     f"configured with {self.keyed_params()}")
        self.check_mergeable(other)
        mine = {name: getattr(self, name) for name in self._states}
        theirs = {name: getattr(other, name) for name in self._states}
        for name, value in merge_states(self._states, mine, theirs, self.name).items():
            setattr(self, name, value)
        return self

    def check_mergeable(self, other: Analysis) -> None:
        """Raise a ValueError that says what differs when ``other``'s state cannot join this one (optional
        hook: the generic checks of :meth:`merge` name the state and its shapes)."""
        return None

    def sync(self, group: Any = None, exchange: str | Path | None = None) -> None:
        """Merge the states of every process of a ``torch.distributed`` group into each (a no-op alone).

        Sums, maxima and minima of tensors are reduced with ``all_reduce``; every other state is gathered and
        merged in rank order; row stores travel as shard files through ``exchange``, a folder every process
        sees (default: one made for this call; :mod:`vitscope.analyses.sync`). Every process ends with the
        state of the whole group.
        """
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
            return
        from vitscope.analyses.sync import sync_states

        for name, value in sync_states(self._states, self.state_dict(), self.name, group, exchange).items():
            setattr(self, name, value)

    def fresh(self) -> Analysis:
        """An empty copy with the same configuration."""
        twin = object.__new__(type(self))  # not copy.copy: __getstate__ may leave out what pickles must not carry
        twin.__dict__.update(self.__dict__)  # configuration shared (never mutated); every state replaced below
        twin.__dict__.pop(_PER_BATCH, None)
        twin.reset()
        return twin

    # ------------------------------------------------------------ what subclasses implement

    @abstractmethod
    def required_hooks(self, spec: ModelSpec) -> list[str]:
        """Canonical hook names (patterns allowed) this analysis reads from the record."""
        ...

    @abstractmethod
    def update(self, record: Mapping[str, torch.Tensor], batch: Batch) -> None:
        """Add one batch (``record``: the recorded tensors; ``batch``: pixels, indices, targets...)."""
        ...

    @abstractmethod
    def compute(self) -> Result | Mapping[str, Any]:
        """The result of everything added so far (an empty analysis gives a result without tensors)."""
        ...

    def result(self) -> Result:
        """:meth:`compute` as a :class:`Result` named after this analysis: a dict is wrapped
        (:func:`~vitscope.analyses.result.as_result`), and the report's paragraph is the class's
        :attr:`description` unless the result brings its own."""
        self.states_to_host()  # compute() sees CPU tensors, wherever the updates kept them
        result = as_result(self.name, self.compute())
        if not result.intro:
            result.intro = type(self).description
        return result

    def stream_hooks(self, spec: ModelSpec) -> list[str]:
        """Hook names (patterns allowed) fed to :meth:`update_hook` the moment the model makes them (default
        none). The engine frees each once every analysis that streams it has read it, unless another analysis
        lists it in :meth:`record_reads`: one block's tensors are alive at a time instead of every block's."""
        return []

    def update_hook(self, name: str, tensor: torch.Tensor, batch: Batch) -> None:
        """Read one streamed hook (:meth:`stream_hooks`) as the model makes it, before :meth:`update` of the
        batch; blocks come in increasing order. Default: keep :meth:`reduce_hook`'s value for :meth:`reduced`."""
        self.per_batch(batch)[name] = self.reduce_hook(name, tensor, batch)

    def reduce_hook(self, name: str, tensor: torch.Tensor, batch: Batch) -> Any:
        """What :meth:`update` needs of one streamed hook (for the default :meth:`update_hook`)."""
        raise VitscopeTypeError(f"{type(self).__name__} streams hooks but defines neither update_hook nor reduce_hook")

    def reduced(self, name: str, record: Mapping[str, torch.Tensor], batch: Batch) -> Any:
        """:meth:`reduce_hook` of ``name``: the value kept while streaming, or computed now from the record (when
        :meth:`update` is called without the engine)."""
        scratch = self.per_batch(batch)
        return scratch.pop(name) if name in scratch else self.reduce_hook(name, record[name], batch)

    def record_reads(self, spec: ModelSpec) -> list[str]:
        """Hook names (patterns allowed) whose recorded values :meth:`update` reads: the required hooks that are
        not streamed. Hooks left out reach :meth:`update` as tensors of the right shape on the ``meta`` device,
        without values, when the engine frees them as they are made."""
        streamed = set(self.stream_hooks(spec))
        return [h for h in self.required_hooks(spec) if h not in streamed]

    def per_batch(self, batch: Batch) -> dict[str, Any]:
        """Scratch space for one batch (filled by :meth:`update_hook`, read by :meth:`update`): a fresh dict for
        every new batch, never saved or merged; :meth:`end_batch` frees it."""
        held = self.__dict__.get(_PER_BATCH)
        if held is None or held[0] is not batch:
            held = (batch, {})
            self.__dict__[_PER_BATCH] = held
        return held[1]

    def end_batch(self) -> None:
        """Free the :meth:`per_batch` scratch."""
        self.__dict__.pop(_PER_BATCH, None)

    def shared_quantities(self, spec: ModelSpec) -> dict[str, frozenset[str]]:
        """Per-batch quantities this analysis reads through :meth:`Batch.quantity`, with their options
        (e.g. ``{"attention_blocks": {"cls"}}``); the engine computes each once per batch for all analyses."""
        return {}

    #: images of the reference set :meth:`reference_hooks` are recorded on (the first of the data)
    reference_images: int = 0

    def reference_hooks(self, spec: ModelSpec) -> list[str]:
        """Hooks this analysis needs recorded on a reference set before the pass (the controls of an ablation: a
        mean, another image's activations); :func:`vitscope.run` records them on the first
        :attr:`reference_images` images of the data, the same in every process and on resume, and hands them to
        :meth:`set_reference`. Default: none."""
        return []

    def set_reference(self, activations: Mapping[str, torch.Tensor]) -> None:
        """Receive ``{hook: [R, ...]}``: :meth:`reference_hooks` recorded on the reference images (index order);
        kept as :attr:`reference` (not state: the engine records it again for every run, resumed or not)."""
        self.__dict__["_reference"] = dict(activations)

    @property
    def reference(self) -> dict[str, torch.Tensor]:
        """What :meth:`set_reference` received (empty before)."""
        return self.__dict__.get("_reference", {})

    def target_transforms(self, spec: ModelSpec) -> dict[str, tuple[str, Callable[[Any], Any]]]:
        """Per-image work on the ground truth that the engine does in its loading thread, beside decoding:
        ``{new target: (source target, function)}``; the batch then carries ``targets[new]`` (images whose
        source target is missing get None). Applies to the model's own preprocessing (no view)."""
        return {}

    def image_transforms(self, spec: ModelSpec) -> dict[str, Callable[[np.ndarray], Any]]:
        """Per-image work on the preprocessed image that the engine does in its loading thread (or workers),
        beside decoding: ``{new target: function}``; each function gets one image as the loader made it, the
        model's resize and crop before normalisation (``[H, W, 3]`` uint8 numpy, at its own size and token grid
        with ``--keep-aspect``: ``spec.grid_for(H, W)``), and the batch then carries ``targets[new]``, one value
        per image, as host data. The shared quantities' own per-image parts (the SIFT keypoints) are added by
        the engine (:data:`~vitscope.analyses.batch.LOADER_WORK`). Applies to the model's own preprocessing (no
        view, no backbone preprocessing of its own): otherwise the targets are missing and the analysis does
        the work itself."""
        return {}

    def supports(self, spec: ModelSpec) -> bool:
        """Whether this analysis can run on ``spec``: no :meth:`why_unsupported` reason, and its hooks exist."""
        return self.why_unsupported(spec) is None and self.hooks_exist(spec)

    def why_unsupported(self, spec: ModelSpec) -> str | None:
        """One-line reason this analysis cannot run on ``spec`` (None when it can; subclasses add checks)."""
        return None

    def why_unsupported_data(self, data: DataFacts) -> str | None:
        """One-line reason this analysis cannot score ``data`` (None when it can; subclasses add checks).

        Asked before the pass (:func:`vitscope.analyses.registry.why_cannot_run`, :func:`vitscope.run`), with
        the ground-truth keys the batches will carry and, on first use, the labels read from the source.
        Default: every key of :attr:`required_targets` must be there.
        """
        missing = set(self.required_targets) - data.targets
        return missing_targets(self.name, missing) if missing else None

    def hooks_exist(self, spec: ModelSpec) -> bool:
        """Whether every hook this analysis needs exists on the model (attention needs a transformer)."""
        from vitscope.hooks.names import (
            UnknownHookError,
            cnn_hook_names,
            expand_names,
            transformer_hook_names,
        )

        if (self.needs_attention or self.needs_transformer) and not spec.is_transformer:
            return False
        valid = transformer_hook_names(spec.num_blocks) if spec.is_transformer else cnn_hook_names(spec.num_blocks)
        try:
            expand_names(self.required_hooks(spec), valid, spec.name)
        except UnknownHookError:
            return False
        return True


_PER_BATCH = "_per_batch_scratch"


def _copy_value(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    return copy.deepcopy(value)


def _recording_params(init: Callable[..., None]) -> Callable[..., None]:
    """Wrap a subclass's ``__init__`` so the outermost call keeps its bound arguments in ``_params``."""
    signature = inspect.signature(init)

    @functools.wraps(init)
    def wrapped(self: Analysis, *args: Any, **kwargs: Any) -> None:
        if "_params" not in self.__dict__:
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            params: dict[str, Any] = {}
            for name, value in list(bound.arguments.items())[1:]:
                kind = signature.parameters[name].kind
                if kind is inspect.Parameter.VAR_KEYWORD:
                    params.update(value)
                elif kind is not inspect.Parameter.VAR_POSITIONAL:
                    params[name] = value
            self.__dict__["_params"] = params
            self.__dict__["_states"] = {}
        init(self, *args, **kwargs)

    wrapped._records_params = True  # type: ignore[attr-defined]
    return wrapped
