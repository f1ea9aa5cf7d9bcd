"""Training a sparse autoencoder from the stream of a model's activations, without writing them anywhere.

Each pass over the data (an epoch, its order shuffled by the seed) is one :func:`vitscope.run`; the hook's tokens go
into an in-memory shuffle buffer, and whenever the buffer is full the SAE trains on a random half of it in
minibatches, the other half staying to mix with the next tokens. Memory is the buffer plus the model, whatever the
data's size.

Standard practice, as in the SAE literature and SAELens: inputs scaled so that the first buffer's tokens have a mean
squared norm of ``d_in`` (recorded in the file), the decoder bias started at the geometric median of the first
buffer, decoder rows of unit norm after every step, Adam with a linear warm-up (the first 5 % of the steps) and a
linear decay to zero (the last 20 %), and against dead latents (none firing for ``dead_after`` tokens) Gao et al.
2024's auxiliary loss, which asks the ``aux_k`` dead latents closest to firing to reconstruct the error. Losses:
``relu`` the squared error plus ``l1`` times the codes' L1 norm; ``topk`` and ``batchtopk`` the squared error (batch
top-k also learns its inference threshold, the running mean of the smallest kept activation, as SAELens);
``matryoshka`` the mean of the squared errors of every nested prefix of the dictionary (Bussmann et al. 2025).

With ``distributed=True`` (under ``torchrun``) each process reads its contiguous part of every pass, as
:func:`vitscope.run` splits one, into a buffer of its own, and the SAE's replicas train in lockstep
(:mod:`vitscope.sae.distributed`): every process ends every step with the same weights, and rank 0 alone writes.
"""

from __future__ import annotations

import math
import os
import shutil
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from vitscope.analyses.base import Analysis, Batch
from vitscope.atomic import atomic_path, remove_leftovers
from vitscope.autoencoders.files import save
from vitscope.autoencoders.model import SparseAutoencoder
from vitscope.autoencoders.tokens import as_tokens, check_selects, selected_tokens
from vitscope.data.open import as_source
from vitscope.data.source_part import SourcePart
from vitscope.engine.batches import shard_range
from vitscope.engine.decoding import data_entry
from vitscope.engine.distributed import barrier, collectives, shard_for
from vitscope.engine.memory import available_bytes
from vitscope.engine.results import EmptyRunError
from vitscope.engine.run import resolve_device, run
from vitscope.errors import VitscopeRuntimeError, VitscopeUsageError, VitscopeValueError
from vitscope.models.backbone import Backbone
from vitscope.sae.distributed import GroupReplicas, Replicas
from vitscope.sae.provenance import data_spec, training_provenance
from vitscope.sae.settings import SAETraining
from vitscope.sae.trainer import Trainer, round_table

__all__ = ["SAETraining", "train"]


class _Stream(Analysis):
    """The tokens of one hook, handed to the trainer as the pass makes them (nothing kept: no declared state but
    the count of images seen)."""

    name = "sae_stream"

    def __init__(self, hook: str, tokens_of: str, feed: Callable[[torch.Tensor], None]) -> None:
        super().__init__()
        self.hook, self.tokens_of, self.feed = hook, tokens_of, feed
        self.add_state("num_images", 0, reduce="sum")

    def required_hooks(self, spec: Any) -> list[str]:
        return [self.hook]

    def stream_hooks(self, spec: Any) -> list[str]:
        return [self.hook]

    def update_hook(self, name: str, tensor: torch.Tensor, batch: Batch) -> None:
        if tensor.dim() == 4 and not batch.spec.is_transformer:  # a CNN map: every position is a token
            tensor = as_tokens(tensor)
        self.feed(selected_tokens(tensor.detach().float(), tuple(batch.spec.prefix_kinds), self.tokens_of))

    def update(self, record: Mapping[str, torch.Tensor], batch: Batch) -> None:
        self.num_images += batch.size

    def compute(self) -> Any:
        return {"num_images": self.num_images}


def _buffer_size(cfg: SAETraining, d_in: int, device: torch.device) -> int:
    if cfg.buffer_tokens is not None:
        return int(cfg.buffer_tokens)
    free = available_bytes(str(device)) or 2**31
    fit = int(free // 8 // (4 * d_in))  # an eighth of free memory
    return max(2 * cfg.batch_tokens, min(fit, 2**22))


def _state_key(backbone: Backbone, hook: str, fingerprint: Mapping[str, Any], config: SAETraining, batch_size: int,
               processes: int) -> str:
    """What a saved training state must match to be resumed (the model's weights, the data's ``fingerprint``, the
    settings, the number of processes: each reads its own part of every pass)."""
    from vitscope.models.digest import model_fingerprint
    from vitscope.strict_json import dumps

    return dumps({"model": model_fingerprint(backbone), "hook": hook, "data": dict(fingerprint),
                  "config": asdict(config), "batch_size": batch_size, "processes": processes})


def _saved(folder: Path | None, key: str) -> dict[str, Any] | None:
    """The training state saved in ``folder`` at an epoch's end for the same run, else None."""
    path = None if folder is None else folder / _STATE_FILE
    if path is None or not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # a torn or foreign file: start over
        return None
    return state if state.get("key") == key else None


def _agree_on_start(replicas: Replicas, first: int, folder: Path | None) -> None:
    """Every process writes states (or none does) and resumes after the same pass (each read the state file
    itself), or none starts: their collectives would not pair up."""
    if replicas.world == 1:
        return
    mine = torch.tensor([first, -first, folder is not None, folder is None], dtype=torch.int64)
    most = replicas.max(mine)
    if int(most[2]) and int(most[3]):
        raise VitscopeValueError("give out to every process of a distributed training or to none (process 0 writes)")
    if int(most[0]) != -int(most[1]):
        raise VitscopeRuntimeError(f"the processes found different training states in {folder} (passes "
                                   f"{-int(most[1])} to {int(most[0])}): --out must be a folder every process sees")


def _no_token(hook: str, source: Any, config: SAETraining) -> VitscopeValueError:
    return VitscopeValueError(f"no token of {hook!r} came from {source.name} ({config.tokens_of} tokens)")


def _end_of_pass(trainer: Trainer | None, replicas: Replicas, make: Callable[[int], Trainer],
                 no_token: Callable[[], Exception]) -> Trainer:
    """This process's part of the pass has ended: train on what the buffers hold (:meth:`Trainer.finish`). A process
    that has read no token yet takes part too, with a trainer as wide as the others' tokens (``make(width)``).

    Raises:
        ``no_token()``: no process has read a token.
    """
    table = None
    if trainer is None:
        table = round_table(replicas, 0, True, 0)
        width = max(row[2] for row in table)
        if not width:
            raise no_token()
        trainer = make(width)
    with torch.inference_mode(False):
        trainer.finish(table)
    return trainer


class ShortTrainingWarning(UserWarning):
    """The training ended before the tokens it was asked for (the passes ran out)."""


def _check_pass(trainer: Trainer, hook: str, name: str, pushed: int, config: SAETraining) -> None:
    """Stop at a pass's end, before its state is saved, when the SAE could not learn from it: tokens holding NaN or
    infinities (the weights are NaN by now), a pass that takes no step (fewer tokens than a minibatch: the
    weights would stay the random ones through every pass), or a training that diverged (a loss or a weight NaN or
    infinite: too high a learning rate). The count is summed over the processes, the step is the same in every one:
    they all stop together."""
    bad = int(trainer.replicas.sum(trainer.nonfinite.clone()))
    if bad:
        raise VitscopeValueError(f"{bad} token(s) of {hook} from {name} hold NaN or infinite values: an SAE cannot "
                                 "be trained on them (look at the model's activations, e.g. under --dtype)")
    if trainer.step == 0:
        raise VitscopeValueError(f"a pass over {name} gives {pushed} token(s) of {hook}, fewer than one minibatch "
                                 f"(batch_tokens {config.batch_tokens}): no training step; lower --batch-tokens or "
                                 "give more images")
    # once a pass, one host sync (none in the steps); the replicas hold the same weights: they all stop together
    finite = torch.stack([torch.isfinite(p).all() for p in trainer.sae.parameters()]).all()
    diverged = [e["step"] for e in trainer.log if not math.isfinite(e["loss"])]
    if diverged or not bool(finite):
        raise VitscopeRuntimeError(f"the SAE's training diverged by step {diverged[0] if diverged else trainer.step} "
                                   "(its loss or weights are NaN or infinite) and no SAE was written: lower the "
                                   f"learning rate (--lr {config.lr:g})")


_STATE_FILE = "training_state.pt"
_STATE_FOLDER = ".training"


def _clear_leftovers(out: Path) -> None:
    """Delete the temporary files a killed training left in ``out`` and its state folder (the SAE's weights, the
    state of a pass), which a finished run would otherwise keep beside its files."""
    for folder in (out, out / _STATE_FOLDER):
        remove_leftovers(folder, stale_pids=frozenset({os.getpid()}))  # this process has written nothing yet


def train(backbone: Backbone, hook: str, data: Any, config: SAETraining = SAETraining(), out: str | Path | None = None,
          batch_size: int = 32, device: str | None = None, log: Callable[[str], None] | None = None,
          distributed: bool = False, record: Mapping[str, Any] | None = None) -> SparseAutoencoder:
    """Train a sparse autoencoder of ``hook``'s activations from passes over ``data`` (nothing written but the SAE).

    With ``out``, the state at the end of every pass (weights, optimiser, counters, random state: never a token)
    goes to ``out/.training/``: the same call after a kill continues from the last finished pass and gives the same
    weights as a run never stopped; the folder is removed when the SAE is written.

    Args:
        backbone: the model; hook: one canonical name (e.g. ``blocks.8.resid_post``).
        data: anything :func:`vitscope.run` reads.
        config: the training (:class:`SAETraining`).
        out: a folder to write the SAE to (SAELens's layout, :func:`vitscope.sae.save`), with the training record.
        batch_size: images per forward pass; device: where the model and the SAE run.
        log: receives a line per epoch (tokens, tokens per second, step, FVU, L0, dead latents).
        distributed: share every pass with the processes of the ``torch.distributed`` group (joined from
            ``torchrun``'s environment when not yet initialised): process ``r`` of ``K`` reads the ``r``-th of
            ``K`` contiguous parts of each pass, each brings ``config.batch_tokens / K`` tokens to every step from a
            buffer of its own, and the replicas take the same steps with their gradients summed; every process
            returns the same SAE, and rank 0 alone logs and writes ``out`` (every process passes the same ``out``,
            a folder they all see).
        record: more of what ``out``'s cfg.json says the SAE was made of, beside what this call records itself
            (:func:`~vitscope.sae.provenance.training_provenance`: vitscope's version, the model's identity with its
            weights digest and preprocessing, the data's description and fingerprint, the device and processes),
            e.g. ``{"environment": vitscope.outputs.writer.environment()}`` as ``vitscope sae train`` passes.

    Returns:
        The trained SAE (``training_log``: its metrics along the way).

    Raises:
        ValueError: a bad configuration, a hook the model does not have, or ``tokens_of`` naming a class token or
            registers it does not have (one line).
        RuntimeError: ``distributed`` without a process group or ``torchrun``; another process stopped; the training
            diverged (its loss or weights NaN or infinite: nothing is saved).
    """
    config.check()
    if not math.isfinite(config.lr):
        raise VitscopeValueError(f"lr must be a finite number, got {config.lr}")
    if hook not in set(backbone.hook_names()):  # a value only the model shows wrong: still bad usage
        raise VitscopeUsageError(f"{backbone.spec.name} has no hook {hook!r}: name one canonical hook, e.g. "
                                 f"blocks.{backbone.spec.num_blocks - 1}.resid_post")
    check_selects(tuple(backbone.spec.prefix_kinds), config.tokens_of, backbone.spec.name)
    source = as_source(data)
    where = resolve_device(device)
    shard = shard_for(distributed, where.type)
    if shard.world > 1 and where.type == "cuda":
        where = torch.device("cuda", shard.gpu)  # one GPU per process (shared when there are fewer)
    if config.batch_tokens < shard.world:
        raise VitscopeValueError(f"batch_tokens ({config.batch_tokens}) must be at least the number of processes "
                                 f"({shard.world}): each brings its share of every minibatch")
    replicas = GroupReplicas(shard) if shard.world > 1 else Replicas()
    log = log if shard.rank == 0 else None
    folder = None if out is None else Path(out) / _STATE_FOLDER
    if out is not None and shard.rank == 0:  # the one writer
        _clear_leftovers(Path(out))
    described = data_entry(source) if out is not None else {}  # the fingerprint once: the key and the record
    key = _state_key(backbone, hook, described.get("fingerprint", {}), config, batch_size, shard.world) \
        if folder is not None else ""
    saved = _saved(folder, key)
    trainer: Trainer | None = None
    pushed = 0  # tokens this process's part of the pass brought

    def make(d_in: int, buffer: int | None = None) -> Trainer:
        with torch.inference_mode(False):  # the pass runs in inference mode; the SAE's tensors must not
            return Trainer(d_in, config, where, buffer or _buffer_size(config, d_in, where), replicas)

    def feed(tokens: torch.Tensor) -> None:
        nonlocal trainer, pushed
        pushed += len(tokens)
        if not len(tokens):  # nothing selected: no trainer from it (no token at all is refused at the pass's end)
            return
        if trainer is None:
            trainer = make(tokens.shape[1])
        trainer.push(tokens)

    first = 0
    if saved is not None:
        # the buffer the first run sized (from the memory free then): its shuffles, so its weights
        buffers = saved["trainer"].get("buffers")
        trainer = make(int(saved["d_in"]), int(buffers[shard.rank]) if buffers else None)
        with torch.inference_mode(False):
            trainer.restore(saved["trainer"])
        first = int(saved["epoch"])
        if log:
            log(f"resumed after pass {first} ({trainer.seen} tokens)")
    order = torch.Generator().manual_seed(config.seed)
    _agree_on_start(replicas, first, folder)
    for epoch in range(config.max_epochs):
        positions = torch.randperm(len(source), generator=order).tolist()
        if epoch < first:
            continue
        if trainer is not None and trainer.done:
            break
        began, before, pushed = time.perf_counter(), trainer.seen if trainer is not None else 0, 0
        part = shard_range(len(positions), shard.rank, shard.world)
        try:
            if len(part) or shard.world == 1:
                run(backbone, SourcePart(source, positions[part.start : part.stop], name=source.name),
                    [_Stream(hook, config.tokens_of, feed)], batch_size=batch_size, device=where, progress=False,
                    workers=0)
        except EmptyRunError:
            if shard.world == 1:  # with several processes, the others' parts may hold tokens
                raise
        trainer = _end_of_pass(trainer, replicas, make, lambda: _no_token(hook, source, config))
        _check_pass(trainer, hook, source.name, pushed, config)
        if log and trainer.log:
            last, rate = trainer.log[-1], (trainer.seen - before) / max(time.perf_counter() - began, 1e-9)
            log(f"epoch {epoch + 1}: {trainer.seen} tokens ({rate:.0f} tokens/s), step {trainer.step}/"
                f"{trainer.steps}, FVU {last['fvu']:.3f}, L0 {last['l0']:.1f}, dead {last['dead']}")
        if folder is not None:
            state = trainer.state()  # every process's random state: a collective
            if shard.rank == 0:
                folder.mkdir(parents=True, exist_ok=True)
                with atomic_path(folder / _STATE_FILE) as partial:
                    torch.save({"key": key, "epoch": epoch + 1, "d_in": int(trainer.buffer.shape[1]),
                                "trainer": state}, partial)
    if trainer is None:  # no pass ran
        raise _no_token(hook, source, config)
    if not trainer.done:
        warnings.warn(f"SAE training stopped after max_epochs={config.max_epochs} passes at step {trainer.step} of "
                      f"{trainer.steps} ({trainer.seen} tokens of {int(config.tokens)}): give more images or raise "
                      "max_epochs", ShortTrainingWarning, stacklevel=2)
    sae = trainer.sae.eval()
    sae.hook, sae.model = hook, backbone.spec.name
    sae.training_log = list(trainer.log)
    buffers = trainer.buffer_sizes() if out is not None else []  # a collective: every process writes or none
    if out is not None and shard.rank == 0:
        made_of = training_provenance(backbone, described, where, shard.world, record)
        save(sae, out, hook=hook, model=backbone.spec.name,
             extra={"training": {**asdict(config), "data": data_spec(data, source), "batch_size": batch_size,
                                 "buffers": buffers, "tokens_seen": trainer.seen, "steps": trainer.step,
                                 "log": trainer.log}, **made_of})
        shutil.rmtree(folder, ignore_errors=True)
    if shard.world > 1:
        with collectives(shard):
            barrier()  # every process returns once the SAE is written
    return sae
