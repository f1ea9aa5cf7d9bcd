"""``vitscope.run``: one pass over a dataset feeding every analysis (DESIGN.md, where data flows)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from vitscope.analyses.base import Analysis, Batch, Result
from vitscope.analyses.batch import ModelRunner, SharedQuantities, union_plan
from vitscope.engine.batches import Dataset, iter_batches
from vitscope.engine.memory import limit_fragmentation
from vitscope.engine.state import Checkpoint, interrupt_guard
from vitscope.functional.attention_blocks import Workspace
from vitscope.hooks.names import expand_names
from vitscope.models.backbone import Backbone


class EmptyRunError(RuntimeError):
    """No image of the dataset could be read."""


@dataclass
class Results(Mapping[str, Result]):
    """Mapping from each analysis's name to its Result, plus what the run saw.

    Attributes:
        results: name -> Result.
        num_images: images fed to the analyses.
        skipped: ``SkippedImage`` records of unreadable files.
        hooks: canonical names recorded.
    """

    results: dict[str, Result]
    num_images: int
    skipped: list = field(default_factory=list)
    hooks: list[str] = field(default_factory=list)

    def __getitem__(self, name: str) -> Result:
        return self.results[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """``"bf16"``/``"bfloat16"``/``"fp16"`` -> autocast dtype; ``None``/``"fp32"`` -> no autocast."""
    if dtype is None or dtype in ("fp32", "float32", torch.float32):
        return None
    table = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in table:
        raise ValueError(f"unknown dtype '{dtype}'; use fp32, bf16 or fp16")
    return table[dtype]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None``/``"auto"`` picks cuda, then mps, then cpu; an unavailable device is a clear error."""
    if device in (None, "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but no CUDA GPU is available; use --device cpu")
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError("device 'mps' requested but MPS is not available; use --device cpu")
    return dev


def _progress(enabled: bool | None):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(stderr=True)
    show = console.is_terminal if enabled is None else enabled
    progress = Progress(TextColumn("[bold]vitscope[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeRemainingColumn(), console=console, disable=not show, transient=False)
    return progress


def as_result(name: str, computed: Result | Mapping[str, Any]) -> Result:
    """A :class:`Result` from what ``compute()`` returned: a Result as is, or a plain dict whose tensors (and
    numbers, as float64 tensors) become the result's tensors and everything else its metadata."""
    if isinstance(computed, Result):
        return computed
    if not isinstance(computed, Mapping):
        raise TypeError(f"analysis '{name}': compute() returned a {type(computed).__name__}; return a Result or a "
                        "dict of tensors and metadata")
    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, Any] = {}
    for key, value in computed.items():
        if isinstance(value, torch.Tensor):
            tensors[key] = value
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            tensors[key] = torch.tensor(value, dtype=torch.float64)
        else:
            meta[key] = value
    return Result(name=name, tensors=tensors, meta=meta)


def required_hook_names(backbone: Backbone, analyses: Sequence[Analysis]) -> list[str]:
    """Union of the hook names every analysis declares, resolved against the backbone."""
    spec = backbone.spec
    names: list[str] = []
    for a in analyses:
        reason = a.why_unsupported(spec)
        if reason:
            raise ValueError(reason)
        if not a.hooks_exist(spec):
            kind = "a CNN and has no attention" if a.needs_attention and not spec.is_transformer else \
                "missing hooks it needs"
            raise ValueError(f"analysis '{a.name}' cannot run on {spec.name}: the model is {kind}")
        for n in expand_names(a.required_hooks(spec), backbone.hook_names(), spec.name):
            if n not in names:
                names.append(n)
    return names


def _restore(checkpoint: Checkpoint | None, analyses: Sequence[Analysis], dataset: Dataset) -> tuple[int, int]:
    """Load saved state (and the files skipped before) when it matches; returns ``(start position, seen)``."""
    point = checkpoint.restore(analyses) if checkpoint is not None else None
    if point is None:
        return 0, 0
    if hasattr(dataset, "skipped"):
        from vitscope.data.images import SkippedImage

        known = {s.path for s in dataset.skipped}
        dataset.skipped[:0] = [SkippedImage(path=p, reason=r) for p, r in point.skipped if p not in known]
        if hasattr(dataset, "_skipped_paths"):
            dataset._skipped_paths.update(p for p, _ in point.skipped)
    return point.position, point.seen


def run(
    backbone: Backbone,
    dataset: Dataset | str,
    analyses: Sequence[Analysis],
    batch_size: int = 16,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    limit: int | None = None,
    strict: bool | None = None,
    progress: bool | None = None,
    checkpoint: Checkpoint | None = None,
) -> Results:
    """Make one pass over ``dataset`` and feed every batch to every analysis.

    Args:
        backbone: the model (moved to ``device``).
        dataset: a dataset object (``len``, ``get``, ``skipped``), or a folder / file list / ``"skimage"``.
        analyses: accumulator instances; each sees every batch once.
        batch_size: images per forward pass.
        device: ``"cpu"``, ``"cuda"``, ``"mps"`` or None for the best available.
        dtype: None/``"fp32"`` or ``"bf16"``/``"fp16"`` autocast (recorded patterns stay float32).
        limit: use only the first ``limit`` images.
        strict: stop at the first unreadable image (default: skip it with a warning).
        progress: force the progress bar on/off (default: on when stderr is a terminal).
        checkpoint: resumable state (:class:`~vitscope.engine.state.Checkpoint`): restored before the pass
            when it matches this run, saved while running and once at the end; Ctrl-C then stops after the
            batch in flight with the state saved.

    Returns:
        :class:`Results` mapping each analysis's ``name`` to its Result.

    Raises:
        ValueError: bad arguments, or an analysis the model cannot support.
        EmptyRunError: no readable image.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    names = [a.name for a in analyses]
    if len(set(names)) != len(names):
        raise ValueError(f"two analyses share a name ({', '.join(names)}); give each a distinct name")
    if isinstance(dataset, str) or hasattr(dataset, "__fspath__"):
        from vitscope.data.images import open_dataset

        dataset = open_dataset(dataset, strict=bool(strict))
    elif strict is not None and hasattr(dataset, "strict"):
        dataset.strict = strict
    dev = resolve_device(device)
    amp = resolve_dtype(dtype)
    backbone.to(dev).eval()
    hooks = required_hook_names(backbone, analyses)
    total = len(dataset) if limit is None else min(limit, len(dataset))
    start, seen = _restore(checkpoint, analyses, dataset)
    limit_fragmentation()  # memory stays flat in the number of images (engine/memory.py)
    autocast = torch.autocast(dev.type, dtype=amp) if amp is not None else contextlib.nullcontext()
    plan = union_plan([a.shared_quantities(backbone.spec) for a in analyses])
    workspace = Workspace()  # work buffers of this run, freed with it
    with _progress(progress) as bar, torch.inference_mode(), backbone.record(hooks) as rec, \
            interrupt_guard(checkpoint is not None) as guard:
        task = bar.add_task(f"{backbone.spec.name}", total=total, completed=start)
        for end, loaded in iter_batches(dataset, backbone, batch_size, limit, start=start):
            bar.update(task, completed=end)
            if loaded is not None:
                pixels = loaded.pixels.to(dev)
                with autocast:
                    backbone(pixels)
                batch = Batch(pixels=pixels, indices=loaded.indices, paths=loaded.paths, spec=backbone.spec,
                              grid=backbone.spec.grid_for(*pixels.shape[-2:]), targets=loaded.targets,
                              shared=SharedQuantities(rec, plan, workspace), model=ModelRunner(backbone, rec))
                for a in analyses:
                    a.update(rec, batch)
                seen += batch.size
                rec.clear()
            if checkpoint is not None:
                checkpoint.after_batch(analyses, end, seen, getattr(dataset, "skipped", []), guard.requested)
    if checkpoint is not None and start < total:
        checkpoint.save(analyses, total, seen, getattr(dataset, "skipped", []))  # a finished pass is kept
    if seen == 0:
        raise EmptyRunError(f"no readable image among {total} files ({len(dataset.skipped)} skipped)")
    workspace.release()
    return Results({a.name: as_result(a.name, a.compute()) for a in analyses}, seen,
                   list(getattr(dataset, "skipped", [])), hooks)
