"""``vitscope zoo build``: train a zoo model from its catalogue entry, score it, ship it.

Training is deterministic for a seed on CPU: batches and augmentations come from seeded generators,
initial weights from the architecture's seed, and every build runs on ``BUILD_THREADS`` intra-op
thread(s) whatever the machine, because float reductions depend on the thread count. Several models
build in parallel processes instead (``jobs``): on two cores that is faster than two threads per model,
whose barriers stall when the machine is shared. The weights are rounded to fp16 before scoring, so
the recorded score is the one the shipped file reproduces.
"""

from __future__ import annotations

import ctypes
import os
import platform
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from vitscope.atomic import remove_leftovers, staging_name
from vitscope.errors import VitscopeValueError
from vitscope.models.backbone import Backbone
from vitscope.train.data import TensorImages, synthetic_split
from vitscope.train.loop import LoopConfig, Recipe, fit
from vitscope.zoo.cards import write_card
from vitscope.zoo.catalog import ZooEntry, get_entry
from vitscope.zoo.heldout import entry_sets, heldout_sets, is_training_identity, pixel_score, score
from vitscope.zoo.store import (
    build_model,
    read_manifest,
    roundtrip_fp16,
    save_weights,
    wrap_zoo_model,
    write_manifest,
    zoo_dir,
)

__all__ = ["BUILD_THREADS", "build", "build_many", "longest_first", "make_recipe", "training_set", "writable_zoo"]


@lru_cache(maxsize=1)
def _rendered(n: int, seed: int, size: int, spurious: float | None) -> TensorImages:
    return synthetic_split(n, seed, size=size, spurious=spurious)  # shared by the models of one ``zoo build``


def training_set(entry: ZooEntry) -> TensorImages:
    """The entry's training images (metric models: training identities only, labelled by identity)."""
    data = _rendered(entry.train_images, entry.data_seed, int(entry.model.get("image_size", 64)), entry.spurious)
    if entry.recipe == "metric":
        data = data.subset(is_training_identity(data.instances)).relabel_by_instance()
    return data


def make_recipe(entry: ZooEntry, backbone: Backbone, num_classes: int) -> Recipe:
    """The recipe object of ``entry`` around ``backbone``."""
    cfg = dict(entry.recipe_config)
    if entry.recipe == "supervised":
        from vitscope.train.supervised import SupervisedConfig, SupervisedRecipe

        return SupervisedRecipe(backbone, SupervisedConfig(**cfg))
    if entry.recipe == "self-distill":
        from vitscope.train.self_distill import SelfDistillConfig, SelfDistillRecipe

        return SelfDistillRecipe(backbone, SelfDistillConfig(**cfg))
    if entry.recipe == "mae":
        from vitscope.train.mae import MAEConfig, MAERecipe

        return MAERecipe(backbone, MAEConfig(**cfg))
    if entry.recipe == "metric":
        from vitscope.train.metric import MetricConfig, MetricRecipe

        return MetricRecipe(backbone, num_classes, MetricConfig(**cfg))
    raise VitscopeValueError(f"unknown recipe '{entry.recipe}'")


BUILD_THREADS = 1


@contextmanager
def _threads(n: int):
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@contextmanager
def _locked(directory: Path):
    """Serialise manifest updates between parallel builds (POSIX advisory lock; no-op elsewhere)."""
    with open(directory / ".manifest.lock", "w") as handle:
        try:
            import fcntl

            fcntl.flock(handle, fcntl.LOCK_EX)
        except ImportError:  # pragma: no cover - Windows
            pass
        yield


def _params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def build(
    name: str | ZooEntry, directory: str | os.PathLike | None = None, workdir: str | os.PathLike | None = None,
    progress: bool | None = None, steps: int | None = None,
) -> dict[str, Any]:
    """Train, score and save one zoo model; return its manifest record.

    Args:
        name: zoo name (``vitscope zoo list``), or an entry of your own.
        directory: where weights, manifest and cards go (default: the zoo directory).
        workdir: where resumable training state is kept (default: ``<directory>/.build``); an interrupted
            build resumes from there when the entry is unchanged (otherwise it says what changed and starts
            over), and the state is removed after success.
        progress: progress bars (default: when stderr is a terminal).
        steps: override the entry's step count (quick checks; the record says so).
    """
    entry = name if isinstance(name, ZooEntry) else get_entry(name)
    out = writable_zoo(directory)
    _clear_leftovers(out)
    with _threads(BUILD_THREADS):
        return _build(entry, out, workdir, progress, steps)


def writable_zoo(directory: str | os.PathLike | None = None) -> Path:
    """The zoo folder ``directory`` names (:func:`zoo_dir`), created; refused before any training when this process
    cannot write into it (the shipped weights of a read-only install, say).

    Raises:
        VitscopeValueError: the folder cannot be created or written (one line, naming ``--dir``).
    """
    out = zoo_dir(directory)
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):  # a real write: os.access says yes to root on a read-only mount
            pass
    except OSError as err:
        raise VitscopeValueError(f"cannot write into the zoo folder {out} ({err.strerror or err}): build into a "
                                 "folder of your own with --dir DIR (directory= from Python), and load its models "
                                 "with VITSCOPE_ZOO_DIR=DIR") from None
    return out


def _clear_leftovers(out: Path) -> None:
    """Delete the temporary files that killed builds left in the zoo folder and its cards (those of the work folder
    go when :func:`fit` starts); the files of builds running in other processes are kept."""
    for folder in (out, out / "cards"):
        remove_leftovers(folder, stale_pids=frozenset({os.getpid()}))  # this process is between writes


def _build(entry: ZooEntry, out: Path, workdir: str | os.PathLike | None, progress: bool | None,
           steps: int | None) -> dict[str, Any]:
    name = entry.name
    work = Path(workdir) if workdir else out / ".build" / name
    started = time.perf_counter()
    data = training_set(entry)
    model = build_model(entry)
    backbone = wrap_zoo_model(model, name, entry)
    recipe = make_recipe(entry, backbone, int(data.labels.max()) + 1)
    total = steps or entry.steps
    snaps = tuple(s for s in entry.snapshot_steps if s < total)
    result = fit(recipe, data, LoopConfig(steps=total, batch_size=entry.batch_size, seed=entry.data_seed,
                                          checkpoint_dir=work, snapshot_steps=snaps, progress=progress,
                                          autocast="bf16", math_attention=entry.math_attention))
    train_seconds = time.perf_counter() - started
    roundtrip_fp16(model)
    sets = entry_sets(entry)
    record: dict[str, Any] = {
        "entry": entry.to_dict(), "steps_trained": total, "params": _params(model),
        "score_kind": entry.score, "score": score(entry, backbone, sets),
        "baselines": {"random_init": score(entry, wrap_zoo_model(build_model(entry), name, entry), sets),
                      "raw_pixels": pixel_score(entry, backbone, sets)},
        "train_seconds": round(train_seconds, 1), "threads": torch.get_num_threads(),
        "torch": torch.__version__, "machine": platform.machine(),
        "loss_first": result.losses[0], "loss_last": sum(result.losses[-20:]) / len(result.losses[-20:]),
        "loss_curve": result.losses[:: max(1, total // 100)], "snapshots": {},
    }
    if entry.spurious is not None:  # how much of the score the background shortcut carries
        clean = heldout_sets(entry.data_seed, int(entry.model.get("image_size", 64)))
        record["score_independent_backgrounds"] = score(entry, backbone, clean)
    staging = out / staging_name(secrets.token_hex(4))  # removed by a later build if this process is killed
    try:
        staged = _stage(entry, staging, model, result.snapshots, record, sets)
        with _locked(out):
            _ship(entry, out, staged, record)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    ckpt = work / "train_state.pt"
    if ckpt.exists():
        ckpt.unlink()
    return record


def _stage(entry: ZooEntry, staging: Path, model: torch.nn.Module, snapshots: dict, record: dict[str, Any],
           sets) -> dict[str, tuple[Path, str]]:
    """Write the weights and snapshot weights of one trained model into ``staging`` and score the snapshots.

    Nothing in the zoo folder changes here: a build killed while scoring leaves the last finished one intact.
    Returns file name -> (staged path, sha256).
    """
    name = entry.name
    staged = {f"{name}.safetensors": _staged_weights(model, staging, name)}
    for step, state in snapshots.items():
        snap = build_model(entry)
        snap.load_state_dict(state)
        roundtrip_fp16(snap)  # the staged file's numbers, so the score is the file's
        snap_name = f"{name}@step{step}"
        staged[f"{snap_name}.safetensors"] = _staged_weights(snap, staging, snap_name)
        record["snapshots"][str(step)] = score(entry, wrap_zoo_model(snap.eval(), snap_name, entry), sets)
    return staged


def _staged_weights(model: torch.nn.Module, staging: Path, name: str) -> tuple[Path, str]:
    path = staging / f"{name}.safetensors"
    return path, save_weights(model, path, name)


def _ship(entry: ZooEntry, out: Path, staged: dict[str, tuple[Path, str]], record: dict[str, Any]) -> None:
    """Move the staged files into the zoo folder, then write the manifest, then remove files it no longer lists.

    Between the first move and the manifest there are only renames (no training, scoring or writing of weights),
    so a kill leaves files that disagree with the manifest only within that short window.
    """
    name = entry.name
    manifest = read_manifest(out)
    old = [f for f in manifest["files"] if f.startswith(f"{name}@step") and f not in staged]  # an older recipe's
    for fname, (path, checksum) in staged.items():
        os.replace(path, out / fname)
        manifest["files"][fname] = checksum
    for fname in old:
        manifest["files"].pop(fname)
    manifest["models"][name] = record
    write_manifest(out, manifest)
    for fname in old:  # only once the manifest no longer lists them
        (out / fname).unlink(missing_ok=True)
    write_card(out, record)


def longest_first(names: list[str], directory: str | os.PathLike | None = None) -> list[str]:
    """``names`` by their last recorded training time, longest first; models never built keep their order last.

    Parallel builds end sooner when the long ones start first (longest-processing-time scheduling). The
    times come from ``directory``'s manifest, else from the default zoo's.
    """
    recorded = {**read_manifest(zoo_dir())["models"], **read_manifest(zoo_dir(directory))["models"]}
    return sorted(names, key=lambda n: -float(recorded.get(n, {}).get("train_seconds", 0.0)))


def build_many(names: list[str], directory: str | os.PathLike | None = None, jobs: int = 1,
               steps: int | None = None) -> Iterator[dict[str, Any]]:
    """Build ``names`` with up to ``jobs`` parallel processes, longest first; yield records as builds finish."""
    writable_zoo(directory)  # before the first model trains
    if jobs <= 1 or len(names) <= 1:
        for n in names:
            yield build(n, directory, steps=steps)
        return
    names = longest_first(names, directory)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    ctx = multiprocessing.get_context("spawn")  # no forked torch thread pools
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_die_with_parent)
    try:
        futures = [pool.submit(build, n, directory, None, False, steps) for n in names]
        for future in as_completed(futures):
            yield future.result()
    except BaseException:  # Ctrl-C, SIGTERM, a failed build: the others stop now (they resume from their state)
        for process in list(getattr(pool, "_processes", {}).values()):  # shutdown would wait for whole builds
            process.kill()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


#: prctl's option that asks the kernel to send a signal to this process when its parent ends
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Pool initializer: a worker ends when the process that started it ends (``kill -9`` of ``zoo build``), rather
    than training on and writing into the zoo unwatched.

    On Linux the kernel kills it (``PR_SET_PDEATHSIG``; the workers are started by the thread that submits the
    builds, which lives as long as the pool); elsewhere a thread watches the parent's id.
    """
    parent = os.getppid()
    if not _kernel_kills_orphan():
        threading.Thread(target=_watch_parent, args=(parent,), name="vitscope-parent-watch", daemon=True).start()
    if os.getppid() != parent:  # the parent ended before the request took effect
        os._exit(1)


def _kernel_kills_orphan() -> bool:
    """Ask Linux to SIGKILL this process when its parent ends; whether it was done."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):  # no C library with prctl
        return False


def _watch_parent(parent: int, every: float = 1.0) -> None:
    """End this process (no clean-up: it is an orphan) once its parent, process ``parent``, has ended."""
    while os.getppid() == parent:
        time.sleep(every)
    os._exit(1)
