"""Where and how a pass runs: device, autocast dtype, loading processes, and the progress bar."""

from __future__ import annotations

import os

import torch

from vitscope.errors import VitscopeUsageError, VitscopeValueError

__all__ = ["MIN_IMAGES_FOR_WORKERS", "describe_device", "dtype_name", "loader_workers", "progress_bar",
           "resolve_device", "resolve_dtype"]

_DEVICES = ("cpu", "cuda")
#: a pass over fewer images decodes in a thread: starting worker processes would cost more than they save
MIN_IMAGES_FOR_WORKERS = 256
_MAX_WORKERS = 8


def loader_workers(requested: int | None, images: int, processes: int = 1) -> int:
    """Processes that decode and preprocess for a pass over ``images`` images (0: a thread of this process).

    Args:
        requested: the user's number (kept as given), or None to choose: one per CPU this process may use
            (shared among ``processes`` on the machine), less one for the process that runs the model, at most
            8; 0 for a pass of fewer than :data:`MIN_IMAGES_FOR_WORKERS` images.
        images: the images this process will read.
        processes: processes of the run on this machine (torchrun's local world size).

    Raises:
        ValueError: a negative number.
    """
    if requested is not None:
        if requested < 0:
            raise VitscopeValueError(f"workers must be 0 or more, got {requested}")
        return int(requested)
    if images < MIN_IMAGES_FOR_WORKERS:
        return 0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(_MAX_WORKERS, cpus // max(1, processes) - 1))


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """``"bf16"``/``"bfloat16"``/``"fp16"`` (or the torch dtypes) -> autocast dtype; ``None``/``"fp32"`` -> no
    autocast.

    Raises:
        VitscopeUsageError: any other dtype (torch's autocast would quietly run float32 for it).
    """
    if dtype is None or dtype in ("fp32", "float32", torch.float32):
        return None
    table = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}
    if dtype in (torch.bfloat16, torch.float16):
        return dtype
    if isinstance(dtype, torch.dtype) or dtype not in table:
        raise VitscopeUsageError(f"unknown dtype '{dtype}'; use fp32, bf16 or fp16")
    return table[dtype]


def dtype_name(dtype: str | torch.dtype | None) -> str:
    """The one name of a pass's precision: ``"fp32"``, ``"bf16"`` or ``"fp16"`` (``"bfloat16"`` is ``"bf16"``)."""
    return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[resolve_dtype(dtype)]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None``/``"auto"`` picks cuda, else cpu; an unavailable device is a clear error.

    Apple's MPS is refused: the analyses keep their sums in float64 on the pass's device, which MPS lacks.
    """
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        dev = None
    if dev is not None and dev.type == "mps":
        raise VitscopeUsageError(f"device '{device}': vitscope keeps its sums in float64, which Apple's MPS does not "
                                 "have; use --device cpu")
    # torch names more device types (meta, xpu, hpu...) than a pass runs on; the cpu is one device
    if dev is None or dev.type not in _DEVICES or (dev.type == "cpu" and dev.index not in (None, 0)):
        raise VitscopeUsageError(f"unknown device '{device}'; use cpu, cuda or cuda:N")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise VitscopeValueError("device 'cuda' requested but no CUDA GPU is available; use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise VitscopeValueError(f"device '{device}' requested but this machine has {count} CUDA GPU"
                                 f"{'s' if count != 1 else ''} (cuda:0 to cuda:{count - 1}); use one of them")
    return dev


def describe_device(device: str | torch.device | None) -> dict[str, str]:
    """The device a pass given ``device`` runs on, as results.json records it beside the one asked for.

    Returns:
        ``{"device": "cpu"}``; on a GPU ``{"device": "cuda:N", "name": ..., "cuda": ...}``: the
        GPU's name and the CUDA version torch was built with (``"hip"`` on ROCm), which decide its kernels.
    """
    dev = resolve_device(device)
    if dev.type != "cuda":
        return {"device": str(dev)}
    index = dev.index if dev.index is not None else torch.cuda.current_device()  # where a bare "cuda" runs
    out = {"device": f"cuda:{index}", "name": torch.cuda.get_device_name(index)}
    if torch.version.cuda:
        out["cuda"] = str(torch.version.cuda)
    elif getattr(torch.version, "hip", None):
        out["hip"] = str(torch.version.hip)
    return out


def progress_bar(enabled: bool | None):
    """A rich progress bar on stderr; by default (``enabled`` None) shown when stderr is a terminal, else plain
    lines every ``VITSCOPE_PROGRESS_SECONDS`` seconds (:class:`~vitscope.engine.plain_progress.PlainProgress`);
    ``enabled=False``: nothing."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from vitscope.engine.progress_columns import RateColumn

    console = Console(stderr=True)
    if enabled is None and not console.is_terminal:
        from vitscope.engine.plain_progress import PlainProgress

        return PlainProgress()
    show = console.is_terminal if enabled is None else enabled
    progress = Progress(TextColumn("[bold]vitscope[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
                        RateColumn(), TimeRemainingColumn(), console=console, disable=not show, transient=False)
    return progress
