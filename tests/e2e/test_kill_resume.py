"""``kill -9`` in the middle of ``vitscope analyze``, then the same command: the numbers equal an uninterrupted
run, and nothing half-written is left (the matrix of kill points is ``benchmarks/kill_matrix.py``)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import torch

from helpers.cli import ENV, cli
from vitscope.data.synthetic.write import synthesize


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return synthesize(tmp_path_factory.mktemp("coco"), "coco", n=24, size=64, seed=3)


def _saved_images(state) -> int:
    try:
        return int(torch.load(state, weights_only=True)["seen"])
    except Exception:  # not written yet
        return 0


def test_kill_9_mid_pass_then_the_same_command(coco, tmp_path):
    out, whole = tmp_path / "out", tmp_path / "whole"
    args = ["analyze", "-m", "tiny-vit", "-d", f"{coco}::coco", "-a", "attention_distance,cka", "-b", "2",
            "--checkpoint-seconds", "0"]
    proc = subprocess.Popen([sys.executable, "-m", "vitscope.cli", *args, "-o", str(out)], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    state = out / ".vitscope-state" / "tiny-vit.pt"
    deadline = time.monotonic() + 120
    while _saved_images(state) < 6 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()
    assert not (out / "results.json").exists()
    seen = _saved_images(state)
    assert 6 <= seen < 24

    resumed = cli(*args, "-o", str(out))
    assert resumed.returncode == 0 and f"resuming from saved state: {seen} images already done" in resumed.stderr
    first = cli(*args, "-o", str(whole))
    a, b = (json.loads((d / "results.json").read_text()) for d in (whole, out))
    assert a["analyses"] == b["analyses"] and b["run"]["resumed_images"] == seen
    assert not [p for p in out.rglob("*") if ".tmp" in p.name or ".staging" in str(p)]
    assert first.returncode == 0

