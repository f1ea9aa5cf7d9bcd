"""One run at a time writes into an output folder: a second process is refused, not mixed with the first."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

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


@pytest.mark.parametrize("command", ["analyze", "compare"])
def test_the_folder_stays_locked_until_the_saved_state_is_removed(tmp_path, monkeypatch, command) -> None:
    """compare let its folder go between its passes and its writing, and both let it go before removing their
    saved state: a second run could start in the gap, resume from that state and lose it."""
    from vitscope.outputs import lock
    from vitscope.workflows import analyze as analyze_module
    from vitscope.workflows import compare as compare_module

    module = analyze_module if command == "analyze" else compare_module
    seen = []
    real = module.clear_state
    monkeypatch.setattr(module, "clear_state", lambda out: (seen.append(Path(out).resolve() in lock._HELD),
                                                            real(out)))
    out = tmp_path / "out"
    if command == "analyze":
        import vitscope

        vitscope.analyze("tiny-vit", "skimage", "attention_stats", out=out, limit=2, workers=0, progress=False)
    else:
        compare_module.compare_models(["tiny-vit", "tiny-vit-p16"], "skimage", out, limit=2, workers=0,
                                      analyses=["attention_stats"], progress=False)
    assert seen == [True] and out.resolve() not in lock._HELD


def test_a_call_in_another_thread_keeps_its_own_folder(tmp_path) -> None:
    """A call let go of the folders other threads' calls had locked, and a second call into a held folder from
    another thread was not refused."""
    import threading

    from vitscope.outputs import lock

    first, second, other = tmp_path / "first", tmp_path / "second", tmp_path / "other"
    for folder in (first, second, other):
        folder.mkdir()
    holding, done = threading.Event(), threading.Event()

    @lock.releasing_outputs
    def hold(folder: Path) -> None:
        lock.hold_output(folder)
        holding.set()
        done.wait(30)

    thread = threading.Thread(target=hold, args=(first,))
    thread.start()
    assert holding.wait(30)
    with pytest.raises(FolderBusyError):
        lock.releasing_outputs(lock.hold_output)(first)
    lock.releasing_outputs(lock.hold_output)(second)  # takes and lets go of its own folder only
    assert first.resolve() in lock._HELD and second.resolve() not in lock._HELD
    done.set()
    thread.join(30)
    assert first.resolve() not in lock._HELD


def test_a_rank_variable_alone_does_not_skip_the_lock(tmp_path, monkeypatch) -> None:
    """RANK set by a cluster launcher (no torchrun) made every process skip the lock and write anyway."""
    from vitscope.outputs import lock

    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    lock.hold_output(tmp_path)
    assert tmp_path.resolve() in lock._HELD
    lock.release_output(tmp_path)


def test_a_folder_prepared_alone_is_taken_over_by_the_next_call(tmp_path) -> None:
    """prepare_output called alone kept the folder locked for good: the process's own next runs were refused."""
    import vitscope
    from vitscope.outputs import lock

    out = prepare_output(tmp_path / "out")
    vitscope.analyze("tiny-vit", "skimage", "attention_stats", out=out, limit=2, workers=0, progress=False)
    assert out.resolve() not in lock._HELD  # the call took it over and let it go
    vitscope.analyze("tiny-vit", "skimage", "attention_stats", out=out, limit=2, workers=0, progress=False)


def test_a_process_group_rank_other_than_0_does_not_lock(tmp_path, monkeypatch) -> None:
    """A distributed run started without torchrun's variables locked on every rank: rank 1 was refused."""
    import torch.distributed as dist

    from vitscope.outputs import lock

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    lock.hold_output(tmp_path)
    assert tmp_path.resolve() not in lock._HELD
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    lock.hold_output(tmp_path)
    assert tmp_path.resolve() in lock._HELD
    lock.release_output(tmp_path)
