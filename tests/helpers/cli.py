"""Run the ``vitscope`` command line as a user does: a fresh process, offline, one intra-op thread."""

from __future__ import annotations

import os
import subprocess
import sys

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def vitscope(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m vitscope.cli ARGS`` with captured text output."""
    return subprocess.run([sys.executable, "-m", "vitscope.cli", *args], capture_output=True, text=True, env=ENV,
                          timeout=timeout)
