"""Merging an analysis's declared state over the processes of a ``torch.distributed`` group.

Tensor states whose rule is ``"sum"``, ``"max"`` or ``"min"`` and whose shape every process agrees on are
reduced in place with ``all_reduce`` (a process that saw nothing contributes the rule's identity). Every
other state (counts a mean depends on, dicts, top-k, row stores, custom rules) is gathered as objects and
merged in rank order with the same rules as :meth:`vitscope.Analysis.merge`, so every process ends with the
state of the whole group.
"""

from __future__ import annotations

from typing import Any

import torch

from vitscope.analyses.state import StateSpec, merge_states

__all__ = ["sync_states"]

_OPS = ("sum", "max", "min")


def _signature(value: Any) -> tuple[tuple[int, ...], torch.dtype] | None:
    return (tuple(value.shape), value.dtype) if isinstance(value, torch.Tensor) else None


def _identity(rule: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    if rule == "sum":
        return torch.zeros(shape, dtype=dtype)
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    return torch.full(shape, info.min if rule == "max" else info.max, dtype=dtype)


def _companions(specs: dict[str, StateSpec]) -> set[str]:
    """States another state's merge reads (a mean's counts, a variance's mean and counts)."""
    return {n for spec in specs.values() for n in (spec.count, spec.mean) if n}


def sync_states(specs: dict[str, StateSpec], values: dict[str, Any], owner: str, group: Any = None
                ) -> dict[str, Any]:
    """The values of every state merged over the group (``values``: this process's; returned anew).

    Args:
        specs: the declared states.
        values: this process's current values.
        owner: the analysis name (for error messages).
        group: the process group (default: the whole world).
    """
    import torch.distributed as dist

    world = dist.get_world_size(group)
    companions = _companions(specs)
    candidates = [n for n, spec in specs.items() if isinstance(spec.reduce, str) and spec.reduce in _OPS
                  and n not in companions and isinstance(values[n], (torch.Tensor, type(None)))]
    signatures: list[Any] = [None] * world
    dist.all_gather_object(signatures, {n: _signature(values[n]) for n in candidates}, group=group)
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" \
        else torch.device("cpu")
    merged: dict[str, Any] = {}
    for name in candidates:
        seen = {s[name] for s in signatures if s.get(name) is not None}
        if len(seen) != 1:  # nobody has one yet, or shapes differ: the general path says what is wrong
            continue
        shape, dtype = next(iter(seen))
        mine = values[name]
        buffer = (mine.detach().clone() if mine is not None else _identity(specs[name].reduce, shape, dtype))
        home = buffer.device
        buffer = buffer.to(device)
        op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[specs[name].reduce]
        dist.all_reduce(buffer, op=op, group=group)
        merged[name] = buffer.to(home)
    rest = {n: spec for n, spec in specs.items() if n not in merged}
    if rest:
        parts: list[Any] = [None] * world
        dist.all_gather_object(parts, {n: values[n] for n in rest}, group=group)
        state = parts[0]
        for part in parts[1:]:
            state = merge_states(rest, state, part, owner)
        merged.update(state)
    return merged
