"""Declared analysis state and how two states of disjoint data merge (torchmetrics' ``add_state``, widened).

An analysis declares each piece of its state once, with the rule that combines two copies of it
(:class:`StateSpec`); merging, resetting, saving, resuming and syncing across processes then need no code in
the analysis. The rules:

=============  ==========================================================================================
``"sum"``      ``a + b`` (tensors, numbers)
``"max"``      element-wise maximum; ``"min"``: minimum
``"cat"``      concatenation: lists (``a + b``) or disk-backed :class:`~vitscope.cache.rowstore.RowStore`
               tables (rows of ``b`` appended; its spilled shards are shared read-only, never copied)
``"mean"``     count-weighted mean; ``count=`` names the state holding the number of examples
``"variance"`` sum of squared deviations (M2) beside a ``"mean"`` state (``mean=``, ``count=``): Chan's formula
``"topk"``     a mapping of aligned tensors; the ``k`` best along ``dim`` by ``key`` (descending), ties by
               ``tie`` (ascending), so the order is total and merging exact
``"same"``     a value both sides must agree on (blocks, geometry, model name); the empty side takes the other
callable       ``reduce(mine, theirs) -> merged`` for the rest (CKA's open minibatches, chosen-image dicts);
               it must not modify ``theirs``
=============  ==========================================================================================

States live on the device of the batches that fed them: an update adds the batch's tensors where they are
(:func:`added`: no copy to the host per batch, which would wait for the GPU), and the engine moves every
state to the CPU once the pass is over (:func:`on_device`), before merging and computing.

Every rule treats ``None`` (and an empty list, dict or string under ``"same"``) as "nothing yet", so a
state whose shape is only known at the first batch can start as ``None``. A ``dict`` value holds one state per
key (per hook, per source) and merges key by key under the same rule; the companions of ``"mean"`` and
``"variance"`` are looked up at the same key. A ``"topk"`` leaf is the mapping that holds the ``key`` field.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from vitscope.errors import VitscopeValueError
from vitscope.functional.moments import merge_mean, merge_moments
from vitscope.functional.topk import merge_topk

__all__ = ["REDUCTIONS", "StateMergeError", "StateSpec", "added", "first_seen", "is_empty", "merge_states",
           "on_device"]

REDUCTIONS: tuple[str, ...] = ("sum", "max", "min", "cat", "mean", "variance", "topk", "same")


def added(total: torch.Tensor | None, value: torch.Tensor) -> torch.Tensor:
    """``total + value`` on ``value``'s device (``value`` itself when there is no total yet): a sum kept where
    the batches are. A total restored from a checkpoint (on the CPU) moves to the batch's device once."""
    if total is None:
        return value
    return total.to(value.device) + value


def on_device(value: Any, device: torch.device | str) -> Any:
    """``value`` with every tensor in it (nested in dicts, lists and tuples) moved to ``device``; anything else
    (numbers, strings, row stores) as it is. Containers are rebuilt, never modified; an object with a
    ``to_device(device)`` method (a state class holding tensors) moves its own tensors."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if callable(getattr(value, "to_device", None)):
        return value.to_device(device)
    if isinstance(value, dict):
        out = copy.copy(value)  # the same kind of mapping
        for k, v in value.items():
            out[k] = on_device(v, device)
        return out
    if isinstance(value, list):
        return [on_device(v, device) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(on_device(v, device) for v in value)
    return value


class StateMergeError(VitscopeValueError):
    """Two states cannot be merged (different geometry, blocks or configuration)."""


@dataclass(frozen=True)
class StateSpec:
    """How one declared state is created and merged.

    Attributes:
        name: attribute name on the analysis.
        default: the empty value (copied on reset), or a zero-argument factory (e.g. a RowStore class).
        reduce: one of :data:`REDUCTIONS` or a callable ``(mine, theirs) -> merged``.
        count: ``"mean"`` / ``"variance"``: the state holding the example counts.
        mean: ``"variance"``: the state holding the means.
        key, tie, k, dim: ``"topk"``: score field, tie-breaker field, entries kept, candidate dimension.
    """

    name: str
    default: Any
    reduce: str | Callable[[Any, Any], Any]
    count: str | None = None
    mean: str | None = None
    key: str | None = None
    tie: str | None = None
    k: int | None = None
    dim: int = 0

    def __post_init__(self) -> None:
        if not callable(self.reduce) and self.reduce not in REDUCTIONS:
            raise VitscopeValueError(f"state '{self.name}': reduce must be one of {REDUCTIONS} or a callable, got "
                                     f"{self.reduce!r}")
        if self.reduce in ("mean", "variance") and not self.count:
            raise VitscopeValueError(f"state '{self.name}': reduce={self.reduce!r} needs count= (the state of the "
                                     "counts)")
        if self.reduce == "variance" and not self.mean:
            raise VitscopeValueError(f"state '{self.name}': reduce='variance' needs mean= (the state of the means)")
        if self.reduce == "topk" and (not self.key or not self.k or self.k < 1):
            raise VitscopeValueError(f"state '{self.name}': reduce='topk' needs key= (the score field) and k >= 1")

    def fresh(self) -> Any:
        """A new empty value."""
        if callable(self.default) and not isinstance(self.default, (torch.Tensor, type(None))):
            return self.default()
        return _copy(self.default)


def _copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    return copy.deepcopy(value)


def is_empty(value: Any) -> bool:
    """``None``, or an empty list, dict, string or set: a side that has seen nothing."""
    return value is None or (isinstance(value, (list, tuple, dict, str, set, frozenset)) and len(value) == 0)


def first_seen(mine: dict, theirs: dict) -> dict:
    """Callable reduce for dicts keyed by dataset index (chosen images): keys already held win."""
    out = dict(mine)
    for key, value in theirs.items():
        if key not in out:
            out[key] = _copy(value)
    return out


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        both = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
        return both and a.shape == b.shape and bool((a == b).all())
    return a == b


def _leaf(spec: StateSpec, mine: Any, theirs: Any, companions: Mapping[str, tuple[Any, Any]], where: str) -> Any:
    """Merge one leaf value (companions: state name -> (mine, theirs) at the same key)."""
    rule = spec.reduce
    if callable(rule):
        if theirs is None:
            return mine
        return _copy(theirs) if mine is None else rule(mine, theirs)
    if rule == "same":
        if is_empty(theirs):
            return mine
        if is_empty(mine):
            return _copy(theirs)
        if not _equal(mine, theirs):
            raise StateMergeError(f"{where}: cannot merge {theirs!r} into {mine!r}; these states come from "
                                  "different models, blocks or input sizes")
        return mine
    if theirs is None:
        return mine
    if mine is None:
        return _copy(theirs)
    if isinstance(mine, torch.Tensor) and rule != "cat" and rule != "topk" and mine.shape != theirs.shape:
        raise StateMergeError(f"{where}: a state of shape {tuple(theirs.shape)} cannot merge into one of shape "
                              f"{tuple(mine.shape)}; they come from different models, blocks or input sizes")
    if rule == "sum":
        return mine + theirs
    if rule in ("max", "min"):
        if isinstance(mine, torch.Tensor):
            return torch.maximum(mine, theirs) if rule == "max" else torch.minimum(mine, theirs)
        return max(mine, theirs) if rule == "max" else min(mine, theirs)
    if rule == "cat":
        if isinstance(mine, list):
            return mine + [_copy(v) for v in theirs]
        mine.extend(theirs)  # a RowStore: the other's shards are sealed and shared, its memory rows copied
        return mine
    if rule == "topk":
        both = {name: torch.cat([mine[name], theirs[name]], dim=spec.dim) for name in mine}
        return merge_topk(both, spec.k, spec.key, spec.tie, spec.dim)
    n_a, n_b = companions[spec.count]
    if rule == "mean":
        return merge_mean(n_a, mine, n_b, theirs)
    mean_a, mean_b = companions[spec.mean]  # "variance": Chan's formula
    return merge_moments(n_a, mean_a, mine, n_b, mean_b, theirs)[1]


def _companion_names(spec: StateSpec) -> tuple[str, ...]:
    return tuple(n for n in (spec.count, spec.mean) if n)


def _is_container(spec: StateSpec, value: Any) -> bool:
    """A dict of per-key states (not a topk leaf, which is the dict holding the score field)."""
    return isinstance(value, dict) and not (spec.reduce == "topk" and spec.key in value) and not callable(spec.reduce)


def _merge(spec: StateSpec, mine: Any, theirs: Any, companions: Mapping[str, tuple[Any, Any]], where: str) -> Any:
    if _is_container(spec, mine) or _is_container(spec, theirs):  # "same" too: the keys both sides hold agree
        mine, theirs = mine if mine is not None else {}, theirs if theirs is not None else {}
        out = dict(mine)
        for key, value in theirs.items():
            at_key = {n: ((a or {}).get(key) if isinstance(a, dict) else a, (b or {}).get(key) if isinstance(b, dict)
                          else b) for n, (a, b) in companions.items()}
            out[key] = _merge(spec, mine.get(key), value, at_key, f"{where}[{key!r}]")
        return out
    return _leaf(spec, mine, theirs, companions, where)


def merge_states(specs: Mapping[str, StateSpec], mine: Mapping[str, Any], theirs: Mapping[str, Any],
                 owner: str = "analysis") -> dict[str, Any]:
    """Merged values of every declared state (``theirs`` is left unchanged; ``mine`` may be reused).

    All new values are computed from the old ones before any is replaced, so a ``"mean"`` merges with the
    counts of both sides before the ``"sum"`` of the counts.

    Raises:
        StateMergeError: a ``"same"`` state differs.
    """
    merged = {}
    for name, spec in specs.items():
        companions = {c: (mine[c], theirs[c]) for c in _companion_names(spec)}
        merged[name] = _merge(spec, mine[name], theirs[name], companions, f"{owner}.{name}")
    return merged
