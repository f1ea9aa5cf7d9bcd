"""docs/errors.md, runtime: devices, memory and interruptions. Out of memory and a second Ctrl-C during the
state save are injected (the forward raises ``torch.OutOfMemoryError``; ``torch.save`` raises
``KeyboardInterrupt``); the Ctrl-C handler itself gets real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from golden.compare import differences
from helpers.bad_input import analyze, cli, finished, one_error, picture
from helpers.cli import ENV


@pytest.fixture
def photos(tmp_path):
    for k in range(3):
        picture(tmp_path / "photos" / f"p{k}.png", seed=k)
    return tmp_path / "photos"


def test_device_cuda_without_cuda(photos, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    one_error(analyze(photos, tmp_path / "out", "--device", "cuda"), "no CUDA GPU is available; use --device cpu")


def test_device_unknown(photos, tmp_path):
    one_error(analyze(photos, tmp_path / "out", "--device", "tpu"), "unknown device 'tpu'; use cpu, cuda", status=2)


@pytest.mark.parametrize("command", [("featviz", "-m", "tiny-vit-sup", "-u", "blocks.5.mlp.post:3"),
                                     ("experiment", "robustness", "-M", "tiny-vit-sup", "-d", "{photos}")])
def test_device_unknown_in_other_commands_before_loading(command, photos, tmp_path):
    """featviz and experiment robustness loaded the model first (robustness also left an empty --out)."""
    result = cli(*(c.format(photos=photos) for c in command), "-o", str(tmp_path / "out"), "--device", "tpu")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unknown device 'tpu'"), result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["analyze", "compare", "probe"])
@pytest.mark.parametrize("option, value", [("--device", "tpu"), ("--dtype", "fp8"), ("--device", "meta")])
def test_device_unknown_refused_before_loading(command, option, value, photos, tmp_path):
    """Nothing is loaded or created before a bad device or dtype is refused: the error is all stderr says."""
    models = ("-M", "tiny-vit,tiny-vit-sup") if command == "compare" else ("-m", "tiny-vit")
    result = cli(command, *models, "-d", str(photos), "-o", str(tmp_path / "out"), option, value)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: unknown {option[2:]} '{value}'"), result.stderr
    assert not (tmp_path / "out").exists()


def test_device_unknown_mps_whose_missing_float64_failed_every_analysis(monkeypatch) -> None:
    """On a Mac the best device was MPS, where the analyses' float64 sums fail at the first batch; nothing picks
    it now, and asking for it is one line."""
    import torch

    from vitscope.engine.settings import resolve_device
    from vitscope.errors import VitscopeUsageError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert resolve_device(None) == torch.device("cpu")
    for device in ("mps", "mps:0", torch.device("mps")):
        with pytest.raises(VitscopeUsageError, match="Apple's MPS does not have; use --device cpu"):
            resolve_device(device)


def test_device_cuda_without_cuda_of_that_number(monkeypatch) -> None:
    """``--device cuda:7`` on a one-GPU machine passed the up-front check and failed later inside torch."""
    import torch

    from vitscope.engine.settings import resolve_device
    from vitscope.errors import VitscopeValueError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("cuda:0") == torch.device("cuda:0") and resolve_device("cuda") == torch.device("cuda")
    with pytest.raises(VitscopeValueError, match=r"'cuda:7' requested but this machine has 1 CUDA GPU \(cuda:0 to "):
        resolve_device("cuda:7")


def test_device_unknown_to_a_pass_or_a_dtype_autocast_ignores_is_refused_from_python() -> None:
    """torch names devices a pass cannot run on (meta crashed at the first copy, xpu in an assertion), and autocast
    quietly runs float32 for a dtype it does not take (float64 was recorded as run)."""
    import torch

    from vitscope.engine.settings import dtype_name, resolve_device, resolve_dtype
    from vitscope.errors import VitscopeUsageError

    for device in ("meta", "xpu", "hpu", "cpu:1"):
        with pytest.raises(VitscopeUsageError, match=f"unknown device '{device}'; use cpu, cuda or cuda:N"):
            resolve_device(device)
    assert resolve_device("cpu:0") == torch.device("cpu:0")
    for dtype in (torch.float64, torch.int8, torch.float8_e4m3fn):
        with pytest.raises(VitscopeUsageError, match="unknown dtype 'torch"):
            resolve_dtype(dtype)
    assert [dtype_name(d) for d in (None, "fp32", torch.float32, "bfloat16", torch.bfloat16, "float16")] == [
        "fp32", "fp32", "fp32", "bf16", "bf16", "fp16"]


def test_out_of_memory_on_a_batch(photos, tmp_path, monkeypatch):
    """The advice works: the batch size it names fits, and the numbers are those of a run that never ran out."""
    from vitscope.models.tiny import TinyViT

    forward = TinyViT.forward

    def exhausted_above_one(self, pixels, *args, **kwargs):
        if pixels.shape[0] > 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return forward(self, pixels, *args, **kwargs)

    whole = finished(analyze(photos, tmp_path / "whole", "-b", "3"), tmp_path / "whole")
    monkeypatch.setattr(TinyViT, "forward", exhausted_above_one)
    line = one_error(analyze(photos, tmp_path / "out", "-b", "2"), "out of memory at a batch of 2; run again with "
                     "a smaller batch (--batch-size / -b 1)")
    assert "no number depends on the batch size" in line
    again = finished(analyze(photos, tmp_path / "out", "-b", "1"), tmp_path / "out")
    assert again["analyses"].keys() == whole["analyses"].keys()
    for name in whole["analyses"]:
        found = differences(whole["analyses"][name]["summary"], again["analyses"][name]["summary"], rtol=1e-5,
                            atol=1e-7)
        assert not found, (name, found[:3])


def test_ctrl_c_once(photos, tmp_path):
    out = tmp_path / "out"
    stopped = analyze(photos, out, "-b", "1", env={"VITSCOPE_STOP_AFTER_BATCHES": "1"})  # Ctrl-C after batch 1
    assert stopped.returncode == 130 and stopped.stderr.strip().endswith("interrupted")
    assert "state saved" in stopped.stderr and "Traceback" not in stopped.stderr
    resumed = analyze(photos, out, "-b", "1")
    assert "resuming from saved state: 1 images already done" in resumed.stderr
    whole = finished(analyze(photos, tmp_path / "whole", "-b", "1"), tmp_path / "whole")
    assert finished(resumed, out)["analyses"] == whole["analyses"]


def test_ctrl_c_twice(photos, tmp_path, monkeypatch):
    import vitscope.engine.state as state

    out = tmp_path / "out"
    save = torch.save
    calls = []

    def second_ctrl_c_while_saving(obj, f, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the first save (after batch 1) went through; Ctrl-C again during the next one
            f.write(b"half a state file")
            raise KeyboardInterrupt
        return save(obj, f, *args, **kwargs)

    monkeypatch.setattr(state.torch, "save", second_ctrl_c_while_saving)
    result = analyze(photos, out, "-b", "1", "--checkpoint-seconds", "0", env={"VITSCOPE_STOP_AFTER_BATCHES": "2"})
    monkeypatch.undo()
    assert result.returncode == 130 and result.stderr.strip().endswith("interrupted")
    assert "Traceback" not in result.stderr
    files = [p for p in out.rglob("*") if p.is_file()]
    assert [p.name for p in files] == ["tiny-vit.pt"]  # the state of batch 1, no temporary file
    assert torch.load(files[0], weights_only=True)["seen"] == 1
    resumed = analyze(photos, out, "-b", "1")
    assert "1 images already done" in resumed.stderr
    whole = finished(analyze(photos, tmp_path / "whole", "-b", "1"), tmp_path / "whole")
    assert json.loads((out / "results.json").read_text())["analyses"] == whole["analyses"]


def test_ctrl_c_twice_with_real_signals():
    from vitscope.engine.state import interrupt_guard

    before = signal.getsignal(signal.SIGINT)  # Python's handler, or SIG_IGN in a shell's background job
    with interrupt_guard() as guard:
        os.kill(os.getpid(), signal.SIGINT)  # the first: finish the batch, save, stop
        assert guard.requested
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)  # the second: stop now
    assert signal.getsignal(signal.SIGINT) is before  # the handler it found is back



#: a plug-in that, at its second batch, sends its process group the signal VITSCOPE_TEST_SIGNAL names: a terminal's
#: Ctrl-C and a batch scheduler's SIGTERM reach the loading workers too
_SIGNALLER = """
import os, signal, time, torch, vitscope


@vitscope.register_analysis("stop_signal")
class StopSignal(vitscope.Analysis):
    def __init__(self):
        super().__init__()
        self.batches = 0
        self.add_state("images", torch.zeros((), dtype=torch.float64), reduce="sum")

    def required_hooks(self, spec):
        return ["blocks.0.resid_post"]

    def update(self, record, batch):
        self.images += record["blocks.0.resid_post"].shape[0]
        self.batches += 1
        if self.batches == 2 and os.environ.get("VITSCOPE_TEST_SIGNAL"):
            os.killpg(0, getattr(signal, os.environ["VITSCOPE_TEST_SIGNAL"]))
            time.sleep(1)  # the signal arrives within the batch, with the workers loading ahead

    def compute(self):
        return {"images": self.images}
"""


@pytest.mark.usefixtures("clean_registry")  # the in-process runs register the plug-in
@pytest.mark.parametrize(("name", "status", "last_line"), [("SIGTERM", 143, "terminated"),
                                                            ("SIGINT", 130, "interrupted")])
def test_terminated_by_the_scheduler(photos, tmp_path, name, status, last_line):
    """SIGTERM to the whole process group (what a batch scheduler sends before it kills a job) ended the run at once:
    no state saved, no message. Real signals, to the command and its two loading workers."""
    for k in range(3, 8):
        picture(photos / f"p{k}.png", seed=k)
    analysis = f"stop_{name.lower()}"  # one module and analysis per test: the in-process runs import it for good
    plugin = tmp_path / f"{analysis}.py"
    plugin.write_text(_SIGNALLER.replace("stop_signal", analysis))
    args = [sys.executable, "-m", "vitscope.cli", "analyze", "--import", str(plugin), "-m", "tiny-vit", "-d",
            str(photos), "-a", f"attention_stats,{analysis}", "-b", "1", "--workers", "2"]
    out = tmp_path / "out"
    stopped = subprocess.run([*args, "-o", str(out)], capture_output=True, text=True, timeout=300,
                             env={**ENV, "VITSCOPE_TEST_SIGNAL": name}, start_new_session=True)
    assert stopped.returncode == status, stopped.stderr
    assert stopped.stderr.strip().splitlines()[-1] == last_line, stopped.stderr
    assert "state saved" in stopped.stderr and "Traceback" not in stopped.stderr, stopped.stderr
    assert not (out / "results.json").exists()
    resumed = cli(*args[3:], "-o", str(out))
    assert "resuming from saved state: 2 images already done" in resumed.stderr, resumed.stderr
    whole = cli(*args[3:], "-o", str(tmp_path / "whole"))
    assert finished(resumed, out)["analyses"] == finished(whole, tmp_path / "whole")["analyses"]


def test_terminated_by_the_scheduler_outside_the_pass(tmp_path):
    """SIGTERM while the command is not in a pass (here: optimising a feature visualisation) ended it at once with
    no clean-up and no message; it runs its clean-up now and says so."""
    import threading

    def outside(signum, frame):
        raise AssertionError("SIGTERM went past the command's handler")

    command = ["featviz", "-m", "tiny-vit-sup", "-u", "blocks.5.mlp.post:3", "-o", str(tmp_path / "out")]
    assert cli(*command, "--steps", "1").returncode == 0  # every module imported: the signal interrupts no import
    timer = threading.Timer(2, os.kill, (os.getpid(), signal.SIGTERM))  # (half an import would stay in this process)
    before = signal.signal(signal.SIGTERM, outside)  # in this process, the one the default action would end
    started = time.monotonic()
    timer.start()
    try:
        result = cli(*command, "--steps", "100000")
        assert signal.getsignal(signal.SIGTERM) is outside  # the command's handler is gone with it
    finally:
        timer.cancel()
        signal.signal(signal.SIGTERM, before)
    assert time.monotonic() - started < 60
    assert result.returncode == 143, result.stderr
    assert result.stderr.strip().splitlines()[-1] == "terminated" and "Traceback" not in result.stderr


@pytest.mark.parametrize("loading", [True, False])
def test_terminated_by_the_scheduler_reaching_forked_workers(loading):
    """A figure worker that died of a group's Ctrl-C printed its traceback; a loading worker that died of SIGTERM
    would fail the batch in flight. Both leave Ctrl-C to their process; a figure pool's worker still ends on
    SIGTERM, which is how the pool ends it (ignoring it hung the writing)."""
    from vitscope.engine.processes import quiet_worker

    child = os.fork()
    if child == 0:  # the worker, forked from a command whose SIGTERM handler raises (the pool's end would print it)
        try:
            signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(3))
            quiet_worker(os.getppid(), (signal.SIGINT, signal.SIGTERM) if loading else (signal.SIGINT,))
            for stop in (signal.SIGINT, signal.SIGTERM):
                os.kill(os.getpid(), stop)
            time.sleep(0.2)
        finally:
            os._exit(0)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == (0 if loading else -signal.SIGTERM)


def test_terminated_by_the_scheduler_is_a_stop_request_in_the_pass():
    from vitscope.engine.state import interrupt_guard

    def outside(signum, frame):
        raise AssertionError("SIGTERM went past the pass's handler")

    before = signal.signal(signal.SIGTERM, outside)
    try:
        with interrupt_guard() as guard:
            os.kill(os.getpid(), signal.SIGTERM)
            assert guard.requested == signal.SIGTERM
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGTERM)
        assert signal.getsignal(signal.SIGTERM) is outside
    finally:
        signal.signal(signal.SIGTERM, before)


def test_terminated_by_the_scheduler_in_a_parallel_zoo_build(tmp_path):
    """A stopped ``zoo build -j 2`` waited for its workers to finish their whole builds (minutes) before it ended."""
    import multiprocessing
    import threading

    from vitscope.errors import Terminated
    from vitscope.zoo.build import build_many

    def terminated(signum, frame):
        raise Terminated

    before = signal.signal(signal.SIGTERM, terminated)  # as the command line does
    builds = build_many(["tiny-vit-sup", "tiny-vit-metric"], tmp_path / "zoo", jobs=2, steps=100_000)
    timer = threading.Timer(3, os.kill, (os.getpid(), signal.SIGTERM))  # the workers have started by then
    started = time.monotonic()
    try:
        timer.start()
        with pytest.raises(Terminated):
            next(builds)
    finally:
        timer.cancel()
        signal.signal(signal.SIGTERM, before)
    assert time.monotonic() - started < 30
    deadline = time.monotonic() + 10
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert multiprocessing.active_children() == []


def _sae_on_device(command, device, photos, tmp_path):
    """``sae train`` or ``sae benchmark`` of the tiny models on ``device``, in this process."""
    if command == "train":
        args = ("-m", "tiny-vit", "--hook", "blocks.3.resid_post", "-d", str(photos), "--tokens", "100")
    else:
        args = ("-M", "tiny-vit", "--images", "4", "--heldout", "4")
    return cli("sae", command, *args, "-o", str(tmp_path / "out"), "--device", device)


@pytest.mark.parametrize("command", ["train", "benchmark"])
def test_device_unknown_sae(command, photos, tmp_path):
    """``sae train`` and ``sae benchmark`` check --device as analyze does: one line, nothing written."""
    result = _sae_on_device(command, "tpu", photos, tmp_path)
    one_error(result, "unknown device 'tpu'; use cpu, cuda", status=2)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["train", "benchmark"])
def test_device_cuda_without_cuda_sae(command, photos, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = _sae_on_device(command, "cuda", photos, tmp_path)
    one_error(result, "no CUDA GPU is available; use --device cpu")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "out").exists()


def test_device_unknown_names_of_one_dtype_resume_each_other(tmp_path, monkeypatch) -> None:
    """``bfloat16`` and ``bf16`` are one autocast dtype, yet a saved state of one was thrown away by the other."""
    import numpy as np

    import vitscope

    images = [np.full((32, 32, 3), 20 * i, dtype=np.uint8) for i in range(8)]
    backbone = vitscope.load_model("tiny-vit")
    monkeypatch.setenv("VITSCOPE_STOP_AFTER_BATCHES", "1")
    with pytest.raises(KeyboardInterrupt):
        vitscope.run(backbone, images, ["attention_distance"], batch_size=4, device="cpu", dtype="bf16",
                     progress=False, resume=tmp_path / "state.pt")
    monkeypatch.delenv("VITSCOPE_STOP_AFTER_BATCHES")
    resumed = vitscope.run(backbone, images, ["attention_distance"], batch_size=4, device="cpu", dtype="bfloat16",
                           progress=False, resume=tmp_path / "state.pt")
    assert resumed.resumed_images == 4 and resumed.num_images == 8
