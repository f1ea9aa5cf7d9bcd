"""``vitscope sae train`` over two real ``torchrun`` processes (gloo, CPU): one SAE trained by replicas in lockstep,
written once by process 0, and a process killed mid-pass resumes to the weights of an uninterrupted run.

Each process reads its part of every pass: 21 images, so 10 and 11 (64 tokens each), in batches of 4 ending in a
short one, into shuffle buffers that fill at different times. Run by ``make distributed-check``
(``VITSCOPE_DISTRIBUTED_CHECK=1``): three launches of two processes, about 30 s on 2 cores. The replicas' lockstep
itself is checked in the default suite (tests/unit/test_sae_distributed.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers.cli import ENV
from vitscope.data.synthetic.write import synthesize

pytestmark = pytest.mark.skipif(os.environ.get("VITSCOPE_DISTRIBUTED_CHECK") != "1",
                                reason="make distributed-check trains an SAE over two processes")

SCRIPT = Path(__file__).parents[1] / "helpers" / "sae_torchrun.py"
#: 32 steps of 128 tokens (64 from each process) over three passes of 1,344 tokens
TRAIN = ["sae", "train", "--model", "tiny-vit-sup", "--hook", "blocks.3.resid_post", "--kind", "batchtopk",
         "--latents", "64", "--k", "4", "--tokens", "4096", "--buffer-tokens", "512", "--batch-tokens", "128",
         "--lr", "1e-3", "-b", "4", "--device", "cpu"]


def _torchrun(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", *args]
    return subprocess.run(command, capture_output=True, text=True, env={**ENV, **(env or {})}, timeout=300)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"{synthesize(tmp_path_factory.mktemp('sae-ddp') / 'world', 'coco', n=21, size=64, seed=3)}::coco"


@pytest.fixture(scope="module")
def whole(world: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """An uninterrupted run, started as a user starts it."""
    out = tmp_path_factory.mktemp("whole") / "sae"
    return out, _torchrun("-m", "vitscope", *TRAIN, "--data", world, "--out", str(out))


def test_two_processes_train_one_sae_that_process_0_writes_and_reports(whole) -> None:
    out, proc = whole
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("batchtopk SAE of blocks.3.resid_post: 64 latents") == 1, proc.stdout  # process 0
    epochs = [line for line in proc.stderr.splitlines() if line.startswith("epoch ")]
    assert [line.split(":")[0] for line in epochs] == ["epoch 1", "epoch 2", "epoch 3"], proc.stderr
    assert all("tokens/s" in line for line in epochs)
    assert sorted(p.name for p in out.iterdir()) == ["cfg.json", "sae_weights.safetensors"]  # no state, no temp
    training = json.loads((out / "cfg.json").read_text())["vitscope"]["training"]
    assert training["steps"] == 32
    fvu = [entry["fvu"] for entry in training["log"]]
    assert fvu[-1] < 0.9 * fvu[0] and fvu[-1] < 1.0, fvu


def test_a_killed_run_resumes_to_the_same_weights_on_both_processes(whole, world: str, tmp_path) -> None:
    out, dump = tmp_path / "sae", tmp_path / "dump"
    dump.mkdir()
    args = [str(SCRIPT), *TRAIN, "--data", world, "--out", str(out)]
    killed = _torchrun(*args, env={"SAE_KILL_AT_STEP": "16"})  # in the second pass: the first one's state is saved
    assert killed.returncode != 0, killed.stdout + killed.stderr
    assert (out / ".training" / "training_state.pt").is_file() and not (out / "cfg.json").exists()
    resumed = _torchrun(*args, env={"SAE_DUMP": str(dump)})
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert resumed.stderr.count("resumed after pass 1 (") == 1, resumed.stderr  # process 0 speaks
    one, two = (torch.load(dump / f"rank{rank}.pt", weights_only=True) for rank in range(2))
    for name, value in one.items():
        assert torch.equal(two[name], value), name
    assert sorted(p.name for p in dump.glob("saved-by-*")) == ["saved-by-rank0"]
    assert (dump / "saved-by-rank0").read_text().splitlines() == [str(out)]  # written once
    assert whole[1].returncode == 0
    a, b = load_file(whole[0] / "sae_weights.safetensors"), load_file(out / "sae_weights.safetensors")
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert not (out / ".training").exists()
