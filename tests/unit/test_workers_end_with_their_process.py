"""Forked workers end with the process that forked them: killed, it left loading and figure workers blocked for
ever, holding its pipes and its output folder's lock (a kill matrix hung on them; every rerun was refused)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are forked on Linux only")

_FORKER = textwrap.dedent("""
    import os, sys, time
    from vitscope.engine.processes import die_with_parent
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        if sys.argv[1] == "ask":
            die_with_parent(parent)
        time.sleep(600)
        os._exit(0)
    print(child, flush=True)
    time.sleep(600)
""")


def _alive(pid: int) -> bool:
    try:  # a zombie has ended: only its parent's wait is missing
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("ask", [True, False])
def test_a_worker_that_asks_ends_when_its_process_is_killed(ask: bool) -> None:
    forker = subprocess.Popen([sys.executable, "-c", _FORKER, "ask" if ask else "no"], stdout=subprocess.PIPE,
                              text=True)
    child = int(forker.stdout.readline())
    time.sleep(0.5)  # the child has made its request
    forker.send_signal(signal.SIGKILL)
    forker.wait()
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    survived = _alive(child)
    if survived:
        os.kill(child, signal.SIGKILL)
    assert survived is not ask  # the control (no request) outlives its killed process: the test can fail


def test_loading_and_figure_workers_ask(monkeypatch) -> None:
    import vitscope.engine.processes as processes
    from vitscope.engine import batches
    from vitscope.outputs import drawing

    asked = []
    ignored = []
    monkeypatch.setattr(processes, "die_with_parent", asked.append)
    monkeypatch.setattr(signal, "signal", lambda stop, how: ignored.append((stop, how)))
    monkeypatch.setattr("torch.set_num_threads", lambda n: None)
    batches._quiet_worker(123, 0)
    drawing._quiet_worker(456)
    assert asked == [123, 456]
    # loading workers leave Ctrl-C and SIGTERM to their process; a pool's figure workers end on SIGTERM
    assert ignored == [(signal.SIGINT, signal.SIG_IGN), (signal.SIGTERM, signal.SIG_IGN),
                       (signal.SIGINT, signal.SIG_IGN), (signal.SIGTERM, signal.SIG_DFL)]
