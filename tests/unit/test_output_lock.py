"""One run at a time writes into an output folder: a second process is refused, not mixed with the first."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from vitscope.outputs import prepare_output
from vitscope.outputs.lock import FolderBusyError, release_output

_HOLDER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from vitscope.outputs.folder import prepare_output
    prepare_output(Path(sys.argv[1]))
    print("held", flush=True)
    sys.stdin.read()  # until the test closes it
""")


@pytest.fixture()
def held(tmp_path):
    """``tmp_path / "out"`` prepared by another process, which holds it until the test ends."""
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(out)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    yield out, holder
    holder.stdin.close()
    holder.wait(timeout=30)


def test_a_second_process_is_refused_until_the_first_ends(held) -> None:
    out, holder = held
    with pytest.raises(FolderBusyError, match=r"another vitscope run is writing into --out .*: wait for it"):
        prepare_output(out)
    holder.stdin.close()
    holder.wait(timeout=30)  # ended: the kernel let go of its lock
    assert prepare_output(out) == out
    release_output(out)


def test_a_process_prepares_its_folder_twice_and_lets_it_go(tmp_path) -> None:
    out = prepare_output(tmp_path / "out")
    assert prepare_output(out) == out  # the workflow, then the writer
    release_output(out)
    probe = subprocess.run([sys.executable, "-c", _HOLDER, str(out)], input="", capture_output=True, text=True)
    assert probe.returncode == 0 and probe.stdout.strip() == "held", probe.stderr



def test_a_call_that_fails_lets_its_folder_go(tmp_path) -> None:
    """A failed vitscope.analyze kept its --out locked until the process ended: a notebook's next run of the
    command line into the folder was refused."""
    import vitscope
    from vitscope.analyses.base import Analysis

    class Boom(Analysis):
        name = "boom_in_update"

        def required_hooks(self, spec):
            return ["blocks.0.attn.pattern"]

        def update(self, record, batch):
            raise RuntimeError("boom in update")

        def compute(self):
            return None

    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="boom in update"):
        vitscope.analyze("tiny-vit", "skimage", analyses=[Boom()], out=out, limit=2, workers=0, progress=False)
    probe = subprocess.run([sys.executable, "-c", _HOLDER, str(out)], input="", capture_output=True, text=True)
    assert probe.returncode == 0 and probe.stdout.strip() == "held", probe.stderr
