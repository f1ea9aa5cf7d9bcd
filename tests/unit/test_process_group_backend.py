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
