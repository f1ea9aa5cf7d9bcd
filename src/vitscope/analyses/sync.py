"""Merging an analysis's declared state over the processes of a ``torch.distributed`` group.

Tensor states whose rule is ``"sum"``, ``"max"`` or ``"min"`` and whose shape every process agrees on are
reduced in place with ``all_reduce`` (a process that saw nothing contributes the rule's identity). Every
other state (counts a mean depends on, dicts, top-k, custom rules) is gathered as objects and merged in rank
order with the same rules as :meth:`vitscope.Analysis.merge`, so every process ends with the state of the
whole group.

State that grows with the number of images (a :class:`~vitscope.cache.rowstore.RowStore`: probe rows,
full-CKA features) never goes through the process group: each process writes its rows as one shard file in
an *exchange folder* every process sees (:func:`exchange_folder`), and only the shard's path is gathered;
each process then reads the others' shards from disk.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from vitscope.analyses.state import StateSpec, merge_states
from vitscope.cache.rowstore import exported_when_pickled
from vitscope.errors import VitscopeRuntimeError

__all__ = ["EXCHANGE_ENV", "exchange_folder", "sync_states"]

#: environment variable naming the folder where processes exchange row shards (default: a temporary folder
#: made by rank 0, which only works when every process runs on one machine)
EXCHANGE_ENV = "VITSCOPE_EXCHANGE_DIR"


def exchange_folder(group: Any = None) -> Path:
    """A folder every process of the group sees, for row shards: ``$VITSCOPE_EXCHANGE_DIR`` or a temporary
    folder rank 0 makes (and removes when it exits).

    Raises:
        RuntimeError: a process cannot see the folder (processes on several machines need
            ``VITSCOPE_EXCHANGE_DIR`` on a file system they share).
    """
    import torch.distributed as dist

    proposal = [None]
    if dist.get_rank(group) == 0:
        base = os.environ.get(EXCHANGE_ENV)
        if base:
            Path(base).mkdir(parents=True, exist_ok=True)
        made = tempfile.mkdtemp(prefix="vitscope-exchange-", dir=base or None)
        atexit.register(shutil.rmtree, made, True)
        proposal = [made]
    dist.broadcast_object_list(proposal, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    folder = Path(proposal[0])
    seen = [None] * dist.get_world_size(group)
    dist.all_gather_object(seen, folder.is_dir(), group=group)
    if not all(seen):
        blind = [r for r, ok in enumerate(seen) if not ok]
        raise VitscopeRuntimeError(f"processes {blind} cannot see {folder}, where processes exchange their rows; set "
                                   f"{EXCHANGE_ENV} to a folder on a file system every node shares")
    return folder

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


def sync_states(specs: dict[str, StateSpec], values: dict[str, Any], owner: str, group: Any = None,
                exchange: str | Path | None = None) -> dict[str, Any]:
    """The values of every state merged over the group (``values``: this process's; returned anew).

    Args:
        specs: the declared states.
        values: this process's current values.
        owner: the analysis name (for error messages).
        group: the process group (default: the whole world).
        exchange: the folder for row shards (:func:`exchange_folder`; made when None).
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
        folder = exchange if exchange is not None else exchange_folder(group)
        with exported_when_pickled(folder):  # row stores, wherever they sit, travel as shard files
            dist.all_gather_object(parts, {n: values[n] for n in rest}, group=group)
        state = parts[0]
        for part in parts[1:]:
            state = merge_states(rest, state, part, owner)
        merged.update(state)
    return merged
