"""Run a test function in several real processes joined by a gloo process group on this machine."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any


def run_gloo(worker: Callable[..., None], *args: Any, processes: int = 2) -> None:
    """Fork ``processes`` processes running ``worker(rank, processes, port, *args)``; ``port`` is a free local
    TCP port for ``init_method=f"tcp://127.0.0.1:{port}"``. Raises when a process fails."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(worker, args=(processes, port, *args), nprocs=processes, start_method="fork")
