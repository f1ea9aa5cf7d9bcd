"""One sparse autoencoder trained by the processes of a ``torchrun`` launch, as replicas kept equal step by step.

Each process reads its own part of every pass and fills its own shuffle buffer; the replicas train together in
*rounds*. A process enters a round when its buffer is full, and at the end of its part of the pass (again and again,
until every process's part has ended). Collectives pair up across processes in the order they are called, not in
time, so a process that has fewer tokens simply waits in its next round. A round opens with one ``all_reduce`` of a
table of every process's buffer fill and whether its pass ended, and :func:`plan_round` turns that table into the
same plan in every process: how many optimiser steps all take, and how many local minibatches each brings to them (a
process out of tokens brings none to the last steps, and such a step's loss is the mean over the tokens that came).
Every step then calls the same collectives in the same order in every process, so no uneven shard, short last batch
or unreadable image can leave a process waiting in a collective that the others never call.

Gradients are summed with one explicit ``all_reduce`` of the flattened gradients rather than torch's
DistributedDataParallel: each process's loss is its share of the mean over the step's tokens (weighted by its count
of tokens, zero when it brings none), which DDP's equal average over processes cannot express, and DDP wants every
process to run the forward pass of every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vitscope.engine.distributed import Shard, collectives

__all__ = ["GroupReplicas", "Replicas", "Round", "local_shares", "plan_round"]


class Replicas:
    """The SAE alone in its process: every collective returns its input unchanged."""

    rank: int = 0
    world: int = 1

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` summed over the processes (a new tensor where there are several)."""
        return values

    def max(self, values: torch.Tensor) -> torch.Tensor:
        """The element-wise maximum of ``values`` over the processes."""
        return values

    def gather(self, values: torch.Tensor) -> list[torch.Tensor]:
        """Every process's ``values`` (same shape everywhere), in rank order."""
        return [values]


class GroupReplicas(Replicas):
    """The replicas in the processes of the ``torch.distributed`` group (gloo on CPU tensors, NCCL on the GPU)."""

    def __init__(self, shard: Shard) -> None:
        import torch.distributed as dist

        self.shard, self.rank, self.world = shard, shard.rank, shard.world
        self.device = torch.device("cuda", shard.gpu) if dist.get_backend() == "nccl" else torch.device("cpu")

    def _reduce(self, values: torch.Tensor, op: str) -> torch.Tensor:
        import torch.distributed as dist

        buffer = values.detach().to(self.device, copy=True).contiguous()
        with collectives(self.shard):  # a peer that died: one clear error, not the backend's
            dist.all_reduce(buffer, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        return buffer.to(values.device)

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        return self._reduce(values, "sum")

    def max(self, values: torch.Tensor) -> torch.Tensor:
        return self._reduce(values, "max")

    def gather(self, values: torch.Tensor) -> list[torch.Tensor]:
        import torch.distributed as dist

        mine = values.detach().to(self.device, copy=True).contiguous()
        parts = [torch.empty_like(mine) for _ in range(self.world)]
        with collectives(self.shard):
            dist.all_gather(parts, mine)
        return [p.to(values.device) for p in parts]


def local_shares(batch_tokens: int, world: int) -> list[int]:
    """Tokens each process brings to a minibatch of ``batch_tokens`` (they differ by at most one)."""
    return [batch_tokens // world + (rank < batch_tokens % world) for rank in range(world)]


@dataclass(frozen=True)
class Round:
    """What the processes do in one round: the same plan in every one of them.

    Attributes:
        steps: optimiser steps every replica takes now.
        taken: tokens each process takes out of its buffer, at random; their first ``batches[r]`` local minibatches
            train and the rest are dropped (as one process drops what of its half is not a whole minibatch).
        batches: local minibatches each process brings, to the first steps of the round (none to the later ones).
        final: every process's part of the pass has ended; every buffer is emptied after the steps.
    """

    steps: int
    taken: tuple[int, ...]
    batches: tuple[int, ...]
    final: bool

    def tokens(self, step: int, shares: Sequence[int]) -> int:
        """Tokens step ``step`` of the round (from 0) sees over all processes."""
        return sum(share for share, count in zip(shares, self.batches) if step < count)


def plan_round(filled: Sequence[int], ended: Sequence[bool], shares: Sequence[int], steps_left: int) -> Round:
    """The round every process runs, from every process's buffer fill and whether its part of the pass ended.

    A process whose pass goes on entered the round with a full buffer: it trains on a random half of it, as one
    process does. A process whose pass ended brings the whole local minibatches it still holds, as many as the
    others' steps take; when every pass has ended, every process brings all it holds and the buffers are emptied.

    Args:
        filled: tokens in each process's buffer; ended: whether each process's part of the pass has ended.
        shares: tokens each process brings to a minibatch (:func:`local_shares`).
        steps_left: optimiser steps the training still takes.
    """
    if all(ended):
        taken = list(filled)
        batches = [f // s for f, s in zip(filled, shares)]
        steps = max(batches)
    else:
        steps = max(f // 2 // s for f, s, e in zip(filled, shares, ended) if not e)
        batches = [min(f // s, steps) if e else f // 2 // s for f, s, e in zip(filled, shares, ended)]
        taken = [n * s if e else f // 2 for f, s, e, n in zip(filled, shares, ended, batches)]
    steps = min(steps, max(0, steps_left))
    return Round(steps, tuple(taken), tuple(min(n, steps) for n in batches), all(ended))
