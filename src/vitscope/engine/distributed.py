"""One pass sharded over processes with ``torch.distributed`` (launched by ``torchrun``).

Work is split by positions: rank ``r`` of ``K`` reads the ``r``-th of ``K`` contiguous parts of the dataset
(:func:`vitscope.engine.batches.shard_range`) in batches of its own, and every image is read exactly once. No
number depends on how images are batched, so the results equal one process's; contiguous parts keep the
images of one index minibatch (CKA) in one process except at the parts' edges. Each rank keeps its analyses
local and merges their declared state at the end (:meth:`vitscope.Analysis.sync`). Gloo on CPU, NCCL on CUDA;
each process pins the GPU ``LOCAL_RANK`` (with more processes than GPUs they share them, over gloo).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from vitscope.errors import VitscopeRuntimeError

# torch is imported where it is used: the command line asks in_torchrun() before any command imports it

__all__ = ["PeerFailedError", "Shard", "barrier", "collectives", "from_torchrun", "gather_lists", "in_torchrun",
           "is_main_process", "leave", "parts_over_ranks", "process_group_backend", "shard_for", "sum_over_ranks"]


class PeerFailedError(VitscopeRuntimeError):
    """Another process of the run stopped (its own error is printed by that process)."""


@dataclass(frozen=True)
class Shard:
    """This process's place in a pass: its rank among ``world`` processes and its device."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    gpu: int = 0  # the CUDA device of this process (processes share GPUs when there are more processes)


def in_torchrun() -> bool:
    """True when this process was started by ``torchrun`` with more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ


def is_main_process() -> bool:
    """Rank 0 of an initialised process group, or a process on its own (it writes outputs and prints)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return int(os.environ.get("RANK", "0")) == 0


def process_group_backend(gpus: int, local_processes: int) -> str:
    """``"nccl"`` when every process of this machine has a GPU of its own, else ``"gloo"`` (CPU runs, and more
    processes than GPUs, which then share them). The NCCL path is exercised only on machines with one GPU per
    process, which this project's test machines do not have: it is chosen here, and untested beyond that."""
    return "nccl" if gpus > 0 and local_processes <= gpus else "gloo"


def from_torchrun(device_type: str) -> Shard:
    """Join the process group ``torchrun`` describes (gloo on CPU, NCCL on CUDA) unless already joined.

    Raises:
        RuntimeError: no process group and no ``torchrun`` environment to make one from.
    """
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        raise VitscopeRuntimeError("distributed=True needs torch.distributed, which this PyTorch build lacks")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    gpus = torch.cuda.device_count() if device_type == "cuda" else 0
    gpu = local_rank % gpus if gpus else 0
    if gpus:  # also in a group the caller started: the collectives use the current device, the pass cuda:gpu
        torch.cuda.set_device(gpu)
    if not dist.is_initialized():
        if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
            raise VitscopeRuntimeError("distributed=True needs an initialised torch.distributed process group or the "
                                       "environment torchrun sets (start with: torchrun --nproc_per_node=K -m vitscope "
                                       "...)")
        dist.init_process_group(backend=process_group_backend(gpus, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    return Shard(dist.get_rank(), dist.get_world_size(), local_rank, gpu)


@contextmanager
def collectives(shard: Shard) -> Iterator[None]:
    """Run the end-of-pass collectives; a peer that crashed becomes one clear :class:`PeerFailedError`."""
    try:
        yield
    except RuntimeError as err:  # gloo and NCCL report a dead peer as RuntimeError (DistBackendError)
        if shard.world == 1 or isinstance(err, PeerFailedError):
            raise
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise PeerFailedError(f"another process of this run stopped before the end of the pass (its error is "
                              f"above); process {shard.rank} of {shard.world} stops too ({first[:160]})") from err


def barrier() -> None:
    """Wait until every process of the group gets here (alone: return at once)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        if dist.get_backend() == "nccl":
            import torch

            dist.barrier(device_ids=[torch.cuda.current_device()])
        else:
            dist.barrier()


def leave() -> None:
    """Leave the process group, if this process joined one (before it exits)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def shard_for(distributed: bool, device_type: str) -> Shard:
    """The shard of this process: the whole pass alone, or its share of the process group."""
    return from_torchrun(device_type) if distributed else Shard()


def sum_over_ranks(value: int, shard: Shard) -> int:
    """``value`` summed over every rank (``value`` itself alone)."""
    if shard.world == 1:
        return value
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", shard.gpu) if dist.get_backend() == "nccl" else torch.device("cpu")
    total = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(total)
    return int(total.item())


def parts_over_ranks(parts: Sequence[dict[str, Any]], shard: Shard) -> list[dict[str, Any]]:
    """The parts of a resumed run (``{"images", "batch_size", "workers"}`` each) with every rank's images added up:
    the ranks stop and resume together, so their lists run in step (where they do not, rank 0's stand)."""
    every = [list(p) for p in gather_lists([list(parts)], shard)]
    if any(len(p) != len(every[0]) for p in every):
        return every[0]
    return [{**first, "images": sum(int(p[i].get("images", 0)) for p in every)} for i, first in enumerate(every[0])]


def gather_lists(items: Sequence[Any], shard: Shard) -> list[Any]:
    """Every rank's ``items`` (small, picklable) concatenated in rank order."""
    if shard.world == 1:
        return list(items)
    import torch.distributed as dist

    parts: list[Any] = [None] * shard.world
    dist.all_gather_object(parts, list(items))
    return [item for part in parts for item in part]
