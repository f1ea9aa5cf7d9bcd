"""Run the ``vitscope`` command line: in this process (fast: most CLI tests) or as a user does (a real process).

A fresh process costs ~5 s here (``import torch`` alone 2-2.5 s), so only a few end-to-end tests pay it:
the ones about exit codes of the real entry point, killing and resuming, and ``--help`` without torch.
"""

from __future__ import annotations

import os
import subprocess
import sys
from unittest import mock

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def vitscope(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m vitscope.cli ARGS`` in a fresh process, with captured text output."""
    return subprocess.run([sys.executable, "-m", "vitscope.cli", *args], capture_output=True, text=True,
                          env=env or ENV, timeout=timeout)


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The same command in this process (typer's runner), answered in the shape of :func:`vitscope`.

    ``env`` adds variables for the duration of the call (offline is always on). Torch runs on one thread, as
    :func:`vitscope` does (``OMP_NUM_THREADS=1``): reductions then round alike, so a run split between a real
    process and this one (kill, then resume) gives the same bits as either alone.
    """
    import torch
    from typer.testing import CliRunner

    from vitscope.cli.main import app

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with mock.patch.dict(os.environ, {"HF_HUB_OFFLINE": "1", **(env or {})}):
            result = CliRunner().invoke(app, list(args))
    finally:
        torch.set_num_threads(threads)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # a traceback the real command would print: show it whole
    return subprocess.CompletedProcess(["vitscope", *args], result.exit_code, result.stdout, result.stderr)


def analyze_and_probe(data: str, out, analyses: str, model: str = "tiny-vit") -> tuple[dict, dict]:
    """``analyze -a analyses`` then ``probe`` of ``model`` on ``data`` (batch 4, no resume), in this process; both must
    succeed. Returns their results.json documents."""
    import json
    from pathlib import Path

    out = Path(out)
    docs = []
    for command, folder, extra in (("analyze", out / "a", ["-a", analyses]), ("probe", out / "p", [])):
        run = cli(command, "-m", model, "-d", data, "-o", str(folder), *extra, "-b", "4", "--no-resume")
        assert run.returncode == 0, run.stdout + run.stderr
        docs.append(json.loads((folder / "results.json").read_text()))
    return docs[0], docs[1]
