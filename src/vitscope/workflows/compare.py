"""``vitscope compare``: every model once over the data (resumably), then per-block curves on shared axes."""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from vitscope.analyses.data_checks import DataFacts
from vitscope.compare import ModelRun, compare_analyses, compare_runs
from vitscope.compare.outputs import comparison_sections
from vitscope.compare.result import ComparisonResult
from vitscope.data.open import as_source
from vitscope.engine.distributed import is_main_process
from vitscope.engine.provenance import model_identity
from vitscope.engine.run import run
from vitscope.engine.settings import resolve_device
from vitscope.errors import VitscopeValueError
from vitscope.models.load import load_model
from vitscope.outputs import RunResult, prepare_output, write_run
from vitscope.workflows.analyze import config_record
from vitscope.workflows.state_files import checkpoint_for, clear_state

__all__ = ["compare", "compare_models", "comparison_run"]


def comparison_run(options: Mapping[str, Any], progress: bool | None = None,
                   log: Callable[[str], None] | None = None, distributed: bool = False) -> RunResult:
    """Run each model once (resumably, state in ``options["out"]``) and compare them; returns what to write.

    Args:
        options: resolved options (:data:`vitscope.workflows.options.COMPARE_OPTIONS`).
        progress: force the progress bars on/off.
        log: receives one-line messages.
        distributed: share each model's pass with the other ``torch.distributed`` processes.

    Raises:
        ValueError: fewer than two models, or a model listed twice.
    """
    models = list(options["models"])
    if len(models) < 2:
        raise VitscopeValueError("compare needs at least two models, e.g. --models tiny-vit-sup,tiny-vit-mae")
    dupes = sorted({m for m in models if models.count(m) > 1})
    if dupes:
        raise VitscopeValueError(f"model {dupes[0]!r} is listed twice in --models; list each model once")
    out = prepare_output(options["out"])
    source = as_source(options["data"], strict=bool(options.get("strict")))
    targets, fingerprint = source.target_keys(), source.fingerprint()
    runs, identities, counts, skipped, data = [], [], {}, {}, {}
    for model_id in models:  # one at a time: only one model is in memory (a failed name resumes cheaply)
        backbone = load_model(model_id)
        analyses = compare_analyses(backbone.spec, targets)
        checkpoint = checkpoint_for(
            out, model_id, backbone, fingerprint, analyses, resume=options.get("resume", True),
            every_seconds=float(options.get("checkpoint_seconds", 60.0)), log=log, batch_size=options["batch_size"],
            limit=options.get("limit"), strict=bool(options.get("strict")),
            device=resolve_device(options.get("device")).type, dtype=options.get("dtype") or "fp32")
        results = run(backbone, source, analyses, batch_size=options["batch_size"], device=options.get("device"),
                      dtype=options.get("dtype"), limit=options.get("limit"), strict=bool(options.get("strict")),
                      progress=progress, checkpoint=checkpoint, distributed=distributed)
        runs.append(ModelRun(model_id, backbone.spec, dict(results.items())))
        identities.append(model_identity(model_id, backbone))
        counts[model_id] = results.num_images
        skipped.update((s.path, s) for s in results.skipped)
        data = results.data
        del backbone
        gc.collect()
    comparison = compare_runs(runs, data=DataFacts(source, targets, options.get("limit")))
    return RunResult("compare", title=f"vitscope compare: {', '.join(models)}", config=config_record(options),
                     results={"compare": ComparisonResult(comparison)}, models=identities, data=data,
                     num_images=max(counts.values()), skipped=list(skipped.values()),
                     extra={"images_per_model": counts}, sections=comparison_sections(comparison, runs),
                     notes=list(comparison.notes), own_sections={"compare"})


def compare(options: Mapping[str, Any], progress: bool | None = None,
            log: Callable[[str], None] | None = None, distributed: bool = False) -> Path:
    """:func:`comparison_run`, written by :func:`vitscope.outputs.write_run`; returns results.json's path.

    With ``distributed``, every process shares the passes and rank 0 alone writes.
    """
    result = comparison_run(options, progress, log, distributed)
    path = Path(options["out"]) / "results.json"
    if distributed and not is_main_process():
        return path
    path = write_run(options["out"], result, progress=progress, figure_files=bool(options.get("figure_files")))
    clear_state(Path(options["out"]))
    return path


def compare_models(models: Sequence[str], data: str | Path, out: str | Path, batch_size: int = 16,
                   device: str | None = None, dtype: str | None = None, limit: int | None = None, strict: bool = False,
                   resume: bool = True, progress: bool | None = None, figure_files: bool = False) -> ComparisonResult:
    """``vitscope compare`` from Python (``vitscope.compare_models``): every model once over ``data``, the per-block
    curves on shared axes written to ``out`` (results.json, tables, report.html) and returned.

    Args:
        models: two or more model names (as :func:`vitscope.load_model` takes them).
        data: a dataset path as ``vitscope compare --data`` takes it: a folder, a file list or
            ``ROOT::FORMAT[:SPLIT]`` (``ROOT::coco`` gives masks).
        out: output folder (it also keeps the resumable state while the models run).
        batch_size, device, dtype, limit, strict, resume, progress, figure_files: as ``vitscope compare``.

    Returns:
        The comparison: curves, best blocks and the model x model CKA; in a notebook it shows as the report's
        card.
    """
    from vitscope.workflows.options import COMPARE_OPTIONS, resolve_options

    options = resolve_options(COMPARE_OPTIONS, {
        "models": list(models), "data": str(data), "out": str(out),
        "batch_size": batch_size, "device": device, "dtype": dtype, "limit": limit, "strict": strict,
        "resume": resume, "figure_files": figure_files}, None)
    result = comparison_run(options, progress)
    write_run(options["out"], result, progress=progress, figure_files=figure_files)
    clear_state(Path(options["out"]))
    return result.results["compare"]
