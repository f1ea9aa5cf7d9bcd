"""Which torch.distributed backend a torchrun process joins: NCCL only when every process of the machine has a GPU
of its own; gloo on CPU and when processes outnumber the GPUs (they share them). NCCL itself is untested here (no
machine of this project has several GPUs): this is the choice, tested."""

from __future__ import annotations

import pytest

from vitscope.engine.distributed import process_group_backend


@pytest.mark.parametrize(("gpus", "processes", "backend"), [
    (0, 1, "gloo"), (0, 4, "gloo"),  # CPU runs
    (1, 1, "nccl"), (8, 8, "nccl"), (8, 4, "nccl"),  # a GPU per process
    (1, 2, "gloo"), (4, 8, "gloo"),  # more processes than GPUs: shared over gloo
])
def test_nccl_only_with_a_gpu_per_process(gpus: int, processes: int, backend: str) -> None:
    assert process_group_backend(gpus, processes) == backend


@pytest.mark.parametrize("started_by_the_caller", [False, True])
def test_each_process_uses_the_gpu_of_its_local_rank(monkeypatch, started_by_the_caller: bool) -> None:
    """In a group the caller had started, the pass ran on cuda:LOCAL_RANK but the collectives on the current device,
    cuda:0 in every process (NCCL: "Duplicate GPU detected", or a hang)."""
    import torch
    import torch.distributed as dist

    from vitscope.engine.distributed import from_torchrun

    chosen: list[int] = []
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(dist, "is_initialized", lambda: started_by_the_caller)
    monkeypatch.setattr(dist, "init_process_group", lambda backend: None)
    monkeypatch.setattr(dist, "get_rank", lambda: 3)
    monkeypatch.setattr(dist, "get_world_size", lambda: 4)
    shard = from_torchrun("cuda")
    assert shard.gpu == 1 and chosen == [1]
