"""The ``vitscope`` command line as ``torchrun -m vitscope`` runs it, with two test hooks read from the environment
(``torchrun tests/helpers/sae_torchrun.py sae train ...``):

* ``SAE_DUMP=<folder>``: every process saves the weights its SAE ended with (``rank<r>.pt``) and notes each SAE file
  it writes (a line in ``saved-by-rank<r>``);
* ``SAE_KILL_AT_STEP=<n>``: process 0 kills itself with SIGKILL as it begins its ``n``-th optimiser step.
"""

from __future__ import annotations

import os
import signal
import sys

# run as a script, its folder comes first on sys.path: the suite's helper modules must not shadow real ones
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import torch  # noqa: E402

import vitscope.sae.trainer as trainer_module  # noqa: E402
import vitscope.sae.training as training  # noqa: E402

RANK = os.environ.get("RANK", "0")
DUMP = os.environ.get("SAE_DUMP")
KILL_AT = int(os.environ.get("SAE_KILL_AT_STEP", "0"))

if DUMP:
    real_train, real_save = training.train, training.save

    def train(*args, **kwargs):
        sae = real_train(*args, **kwargs)
        torch.save(sae.state_dict(), os.path.join(DUMP, f"rank{RANK}.pt"))
        return sae

    def save(sae, out, **kwargs):
        with open(os.path.join(DUMP, f"saved-by-rank{RANK}"), "a") as notes:
            notes.write(f"{out}\n")
        return real_save(sae, out, **kwargs)

    training.train, training.save = train, save

if KILL_AT and RANK == "0":
    real_step, begun = trainer_module.Trainer._step, []

    def step(self, x, total):
        begun.append(1)
        if len(begun) == KILL_AT:
            os.kill(os.getpid(), signal.SIGKILL)
        return real_step(self, x, total)

    trainer_module.Trainer._step = step

from vitscope.cli.main import app  # noqa: E402  (after the hooks, as -m vitscope would import it)

app(sys.argv[1:], prog_name="vitscope")
