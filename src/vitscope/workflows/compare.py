"""``vitscope compare``: every model once over the data (resumably), then per-block curves on shared axes."""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from vitscope.analyses.data_checks import DataFacts
from vitscope.analyses.plugins import analysis_sources
from vitscope.analyses.registry import not_run_text
from vitscope.comparison import ModelRun, compare_analyses, compare_runs
from vitscope.comparison.analyses import compare_not_run, shown_by_comparison
from vitscope.comparison.curves import CKA_ESTIMATORS
from vitscope.comparison.names import file_safe, named_models
from vitscope.comparison.outputs import comparison_sections
from vitscope.comparison.result import ComparisonResult
from vitscope.data.fingerprint import held_fingerprints
from vitscope.data.open import as_source
from vitscope.engine.distributed import is_main_process
from vitscope.engine.provenance import model_identity
from vitscope.engine.results import run_record
from vitscope.engine.run import PassTally, run
from vitscope.engine.settings import describe_device
from vitscope.models.input_size import describe_input
from vitscope.models.load import load_model
from vitscope.outputs import RunResult, prepare_output, write_run
from vitscope.outputs.folder import check_output
from vitscope.outputs.lock import releasing_outputs
from vitscope.workflows.launch import role
from vitscope.workflows.options import CompareOptions, ConfigError, resolve
from vitscope.workflows.sae_cards import finish_sae_cards
from vitscope.workflows.state_files import clear_state, resume_from

__all__ = ["compare_command", "compare_models", "comparison_run"]


@held_fingerprints()  # every pass of the command stats the files once
@releasing_outputs
def comparison_run(options: CompareOptions, progress: bool | None = None,
                   log: Callable[[str], None] | None = None, distributed: bool = False) -> RunResult:
    """Run each model once (resumably, state in ``options.out``) and compare them; returns what to write.

    Args:
        options: what to compare (:class:`~vitscope.workflows.options.CompareOptions`): ``models`` (entries
            ``MODEL`` or ``NAME=MODEL``, or a mapping name -> model: :func:`vitscope.comparison.names.named_models`),
            ``analyses`` and ``params`` (:func:`vitscope.comparison.compare_analyses`), data and pass settings.
        progress: force the progress bars on/off.
        log: receives one-line messages.
        distributed: share each model's pass with the other ``torch.distributed`` processes.

    Raises:
        ValueError: fewer than two models, a name given twice, an unknown analysis or a bad parameter.
    """
    check_output(options.out)  # before any work: a wrong --out costs nothing
    models = named_models(options.models)
    selection, params = options.analyses, options.params
    _check_selection(selection)
    if options.cka_estimator not in CKA_ESTIMATORS:  # before any model loads
        raise ConfigError(f"--cka-estimator must be one of {', '.join(CKA_ESTIMATORS)}, got {options.cka_estimator!r}")
    options.check_placement()
    source = as_source(options.data, strict=options.strict)  # one Source for every model's pass
    targets = source.target_keys()
    facts = DataFacts(source, targets, options.limit)  # a named analysis the data cannot feed: refused now
    first = _load_each(models, options)  # a bad name, size or option is refused before any pass
    out = prepare_output(options.out)  # once the data opens and the models load: a refused run leaves no folder
    runs, identities, counts, skipped, data, extra, notes = [], [], {}, {}, {}, {}, []
    left: dict[str, dict[str, str]] = {}  # analysis -> {model name: why that model does not run it}
    ran: list = []  # every analysis some model ran, once each (their sources are recorded)
    passes = PassTally()  # what the models' passes resumed and cost, together
    for name, model_id in models:  # one at a time: only one model is in memory (a failed pass resumes cheaply)
        backbone = first if first is not None else _load(model_id, options)
        first = None
        analyses, cannot = compare_analyses(backbone.spec, targets, selection, params, facts)
        left_out = cannot if selection else compare_not_run(backbone.spec, targets)
        for analysis, reason in left_out.items():
            left.setdefault(analysis, {})[name] = reason
        if log:
            log(describe_input(backbone.spec) + (f"; not run: {not_run_text(left_out)}" if left_out else ""))
        results = run(backbone, source, analyses, batch_size=options.batch_size, device=options.device,
                      dtype=options.dtype, limit=options.limit, strict=options.strict, progress=progress,
                      resume=resume_from(out, name, options.resume), checkpoint_seconds=options.checkpoint_seconds,
                      log=log, distributed=distributed, workers=options.workers, jpeg_draft=options.jpeg_draft,
                      compile_stats=options.compile_stats)
        if not distributed or is_main_process():
            finish_sae_cards(results, backbone, source, log)
        passes.add(results)
        ran.extend(a for a in analyses if a.name not in {r.name for r in ran})
        runs.append(ModelRun(model_id, backbone.spec, dict(results.items()), name))
        identities.append({**model_identity(model_id, backbone), "display_name": name,
                           "analyses": [a.name for a in analyses], "grids": results.grids})
        counts[name] = results.num_images
        skipped.update((s.path, s) for s in results.skipped)
        data = results.data
        extra.update(_per_model_results(name, results))
        if selection:  # what the user named and a model cannot run is also a note beside the curves
            notes += [f"not run on {name}: {analysis} ({reason})" for analysis, reason in cannot.items()]
        del backbone
        gc.collect()
    comparison = compare_runs(runs, data=facts, cka_estimator=options.cka_estimator)
    comparison.notes += notes
    names = [name for name, _ in models]
    not_run = {analysis: _not_run_reason(reasons, names) for analysis, reasons in left.items()}
    outside = analysis_sources(ran)  # plugin analyses: the code that made their numbers
    imports = {"imports": outside} if outside else {}
    return RunResult("compare", title=f"vitscope compare: {', '.join(names)}", config=options.record(**imports),
                     results={"compare": ComparisonResult(comparison), **extra}, models=identities, data=data,
                     num_images=max(counts.values()), skipped=list(skipped.values()), skipped_analyses=not_run,
                     extra={"images_per_model": counts}, sections=comparison_sections(comparison, runs),
                     notes=list(comparison.notes), own_sections={"compare"}, device=describe_device(options.device),
                     **run_record(passes))


def _load(model_id: str, options: CompareOptions):
    return load_model(model_id, image_size=options.image_size, keep_aspect=options.keep_aspect)


def _load_each(models: Sequence[tuple[str, str]], options: CompareOptions):
    """Load every model once before any pass, in reverse order, keeping only the last loaded (the first model, which
    runs first), so that an unknown name, a size a model's patches do not divide or ``keep_aspect`` on a CNN stops
    the command before the passes of the models listed before it; one model is in memory at a time."""
    backbone = None
    for _, model_id in reversed(models):
        backbone = None  # the one loaded before goes first
        gc.collect()
        backbone = _load(model_id, options)
    return backbone


def _not_run_reason(reasons: Mapping[str, str], names: Sequence[str]) -> str:
    """Why an analysis was not run, over every model of the comparison.

    Args:
        reasons: ``{model name: reason}`` of the models that did not run it.
        names: every model of the comparison.

    Returns:
        The reason alone when every model gave it (the data's lack is everyone's); else each reason after the
        models that gave it (``"a, b: reason; c: other reason"``), so no model is taken for one that ran it.
    """
    by_reason: dict[str, list[str]] = {}
    for name, reason in reasons.items():
        by_reason.setdefault(reason, []).append(name)
    if len(by_reason) == 1 and len(reasons) == len(names):
        return next(iter(by_reason))
    return "; ".join(f"{', '.join(models)}: {reason}" for reason, models in by_reason.items())


def _check_selection(selection: Sequence[str] | None) -> None:
    """Unknown analysis names fail before any model is loaded."""
    from vitscope.analyses.registry import ANALYSES, GROUPS, unknown_analysis

    for entry in selection or ():
        base = entry.strip().partition("@")[0]
        if base not in ANALYSES and base not in GROUPS:
            raise unknown_analysis(base)


def _per_model_results(name: str, results: Mapping[str, Any]) -> dict[str, Any]:
    """The results of one model that the comparison does not show itself, each named ``ANALYSIS@NAME`` (its
    files, section and results.json entry; ``cka@cls`` of ``dino`` is ``cka@cls@dino``)."""
    out = {}
    for key, result in results.items():
        if shown_by_comparison(key, result):
            continue
        result.name = f"{key}@{file_safe(name)}"
        out[result.name] = result
    return out


@releasing_outputs
def compare_command(options: CompareOptions, log: Callable[[str], None] | None = None) -> Path | None:
    """``vitscope compare``: :func:`comparison_run` in this process's role, written by
    :func:`vitscope.outputs.write_run` (under ``torchrun`` every process shares the passes and rank 0 alone writes).

    Returns:
        The path of results.json (None on the other processes of a ``torchrun`` launch).
    """
    with role(log) as me:
        result = comparison_run(options, me.progress, me.log, distributed=me.distributed)
        if not me.main:
            return None
        path = write_run(options.out, result, progress=me.progress, figure_files=options.figure_files)
        clear_state(Path(options.out))
    return path


@releasing_outputs
def compare_models(models: str | Sequence[str] | Mapping[str, str], data: str | Path, out: str | Path,
                   batch_size: int = 16, device: str | None = None, dtype: str | None = None,
                   limit: int | None = None, strict: bool = False,
                   resume: bool = True, progress: bool | None = None, figure_files: bool = False,
                   analyses: str | Sequence[str] | None = None,
                   params: Mapping[str, Mapping[str, Any]] | None = None,
                   image_size: int | None = None, keep_aspect: bool = False, workers: int | None = None,
                   jpeg_draft: bool = False, compile_stats: bool = False,
                   checkpoint_seconds: float = 60.0, cka_estimator: str = "full_unbiased") -> ComparisonResult:
    """``vitscope compare`` from Python (``vitscope.compare_models``): every model once over ``data``, the per-block
    curves on shared axes written to ``out`` (results.json, tables, report.html) and returned.

    Args:
        models: two or more models as :func:`vitscope.load_model` takes them, each optionally named
            (``["dino=hf:facebook/dinov2-small", "tiny-vit"]``), or a mapping display name -> model
            (``{"dino": "hf:facebook/dinov2-small", "vit": "tiny-vit"}``), or one comma-separated string of them;
            names label the curves, tables and report.
        data: a dataset path as ``vitscope compare --data`` takes it: a folder, a file list or
            ``ROOT::FORMAT[:SPLIT]`` (``ROOT::coco`` gives masks).
        out: output folder (it also keeps the resumable state while the models run).
        batch_size, device, dtype, limit, strict, resume, progress, figure_files, image_size, keep_aspect, workers,
            jpeg_draft, compile_stats, checkpoint_seconds: as ``vitscope compare`` (and :func:`vitscope.analyze`).
        analyses: what each model runs besides the pooled features (names or groups, as ``vitscope analyze``;
            default: attention distance, maps and, with masks, saliency IoU).
        params: ``{analysis: {parameter: value}}`` for them.
        cka_estimator: the CKA between models, ``"full_unbiased"`` (default) or ``"full"`` (biased), as
            ``vitscope compare --cka-estimator``.

    Returns:
        The comparison: curves, best blocks and the model x model CKA; in a notebook it shows as the report's
        card.
    """
    options = resolve(CompareOptions, {
        "models": dict(models) if isinstance(models, Mapping) else models if isinstance(models, str) else list(models),
        "data": str(data), "out": str(out),
        "analyses": analyses, "params": {k: dict(v) for k, v in params.items()} if params else None,
        "batch_size": batch_size, "device": device, "dtype": dtype, "limit": limit, "strict": strict,
        "resume": resume, "figure_files": figure_files, "image_size": image_size, "keep_aspect": keep_aspect,
        "workers": workers, "jpeg_draft": jpeg_draft, "compile_stats": compile_stats,
        "checkpoint_seconds": checkpoint_seconds, "cka_estimator": cka_estimator})
    result = comparison_run(options, progress)
    write_run(options.out, result, progress=progress, figure_files=options.figure_files)
    clear_state(options.out)
    return result.results["compare"]
