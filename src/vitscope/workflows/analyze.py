"""``vitscope analyze`` and ``vitscope.analyze``: one pass of chosen analyses over a dataset, with every output
written. Both build one :class:`~vitscope.workflows.options.AnalyzeOptions` and hand it to :func:`run_analyze`."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from vitscope.analyses.base import Analysis
from vitscope.analyses.data_checks import DataFacts
from vitscope.analyses.params import build_analyses
from vitscope.analyses.plugins import analysis_sources
from vitscope.analyses.registry import (
    GROUPS,
    default_analyses,
    get_analysis,
    not_run_text,
    skipped_defaults,
    why_skipped,
)
from vitscope.data.open import as_source
from vitscope.engine.distributed import is_main_process
from vitscope.engine.provenance import model_identity
from vitscope.engine.results import Results, run_record
from vitscope.engine.run import run
from vitscope.engine.settings import describe_device
from vitscope.errors import VitscopeTypeError, VitscopeValueError
from vitscope.models.backbone import Backbone
from vitscope.models.input_size import describe_input, keeping_aspect, with_image_size
from vitscope.models.load import load_model
from vitscope.outputs import RunResult, prepare_output, write_run
from vitscope.outputs.folder import check_output
from vitscope.outputs.lock import releasing_outputs
from vitscope.workflows.launch import role
from vitscope.workflows.options import AnalyzeOptions
from vitscope.workflows.sae_cards import finish_sae_cards
from vitscope.workflows.state_files import clear_state, resume_from

__all__ = ["analyses_not_run", "analyze", "analyze_command", "choose_analyses", "run_analyze"]


def choose_analyses(selection: str | Sequence[str | Analysis] | None, spec: Any, targets: frozenset[str],
                    params: Mapping[str, Mapping[str, Any]] | None = None, data: DataFacts | None = None
                    ) -> list[Analysis]:
    """Analyses from names, groups (``attention``), labelled instances (``cka@cls``) or instances (the named ones
    first, then the instances as given).

    None selects every default analysis the model and data support; ``params`` configures named ones
    (:func:`vitscope.analyses.params.build_analyses`). ``data`` (what is known of the data: its labels...)
    lets the choice leave out, or refuse when named, analyses that cannot score it (k-NN on one class).

    Raises:
        ValueError: an unknown name, an analysis that cannot run, a bad parameter (one line each);
            DegenerateDataError when the data is the reason.
    """
    if isinstance(selection, str):
        selection = [s for s in selection.split(",") if s.strip()]
    items = list(selection or ())
    odd = [a for a in items if not isinstance(a, (str, Analysis))]
    if odd:
        raise VitscopeTypeError(f"pass analysis names or Analysis instances, not {type(odd[0]).__name__}")
    given = [a for a in items if isinstance(a, Analysis)]  # run as they are, after the named ones
    selection = [a for a in items if isinstance(a, str)]
    if given and not selection:
        return given
    if selection and any(n.strip() == "attention" for n in selection) and not spec.is_transformer:
        from vitscope.analyses.attention.suite import NoAttentionError

        raise NoAttentionError(f"the attention analyses need attention patterns, but {spec.name} is a CNN and has "
                               "no attention; use a transformer or other analyses")
    names = list(selection) if selection else [a.name for a in default_analyses(spec, targets, data)]
    chosen = build_analyses(names, spec, targets, params, data=data) + given
    if not chosen:
        raise VitscopeValueError(f"no analysis supports {spec.name} with this data")
    return chosen


def analyses_not_run(selection: str | Sequence[str | Analysis] | None, spec: Any, targets: frozenset[str],
                     data: DataFacts | None = None) -> dict[str, str]:
    """What a default run (None) or a group in ``selection`` leaves out on this model and data: name -> reason
    (``{"saliency_iou": "the data has no object masks"}``; ``data``: what is known of the data, so one class or
    no labels are reasons too). Names asked for one by one are not listed: those that cannot run are refused
    (:func:`choose_analyses`)."""
    if selection is None or (not isinstance(selection, str) and not selection):
        return skipped_defaults(spec, targets, data)
    names = selection.split(",") if isinstance(selection, str) else [n for n in selection if isinstance(n, str)]
    out: dict[str, str] = {}
    for group in (n.strip() for n in names):
        for name in GROUPS.get(group, ()):
            reason = why_skipped(get_analysis(name), spec, targets, data)
            if reason is not None:
                out.setdefault(name, reason)
    return out


def analyze(model: str | os.PathLike | Backbone, data: Any, analyses: str | Sequence[str | Analysis] | None = None, *,
            out: str | Path | None = None, params: Mapping[str, Mapping[str, Any]] | None = None,
            batch_size: int = 16, device: str | None = None, dtype: str | None = None, limit: int | None = None,
            strict: bool = False, resume: bool = True, checkpoint_seconds: float = 60.0,
            progress: bool | None = None, log: Callable[[str], None] | None = None, distributed: bool = False,
            figure_files: bool = False, image_size: int | tuple[int, int] | None = None, keep_aspect: bool = False,
            workers: int | None = None, jpeg_draft: bool = False, compile_stats: bool = False) -> Results:
    """Run analyses over a dataset in one pass; with ``out``, write results.json, tables, arrays, figures and
    report.html there (resumably: an interrupted call with the same arguments continues).

    The keyword arguments are those of ``vitscope analyze`` (:class:`~vitscope.workflows.options.AnalyzeOptions`,
    which :func:`run_analyze` takes whole).

    Args:
        model: a registered name, ``hf:<id or dir>``, a directory (a string or a ``Path``), or a Backbone.
        data: anything :func:`vitscope.data.as_source` opens (folder, ``ROOT::FORMAT``, images...).
        analyses: names or groups (``"attention,cka@cls"``), Analysis instances, or None for the defaults.
        out: output folder (checked before the pass); None writes nothing.
        params: ``{analysis: {parameter: value}}`` for named analyses.
        batch_size, device, dtype, limit, strict: as :func:`vitscope.run`.
        resume: keep state in ``out`` while running and continue from it (with ``out`` only).
        checkpoint_seconds: least seconds between state saves.
        progress: progress bars on/off (default: when stderr is a terminal).
        log: receives one-line messages.
        figure_files: also draw PNG and SVG files of the figures the report shows as charts.
        image_size: run the model at this input size (side, or ``(H, W)``) instead of its preprocessing's
            (:func:`vitscope.load_model`).
        keep_aspect: each image at its own aspect ratio and token grid (:func:`vitscope.load_model`).
        workers: processes that decode the images (:func:`vitscope.run`; None: chosen from the CPUs).
        jpeg_draft: decode JPEGs at reduced DCT scales (:func:`vitscope.run`).
        compile_stats: the attention statistics through ``torch.compile`` (:func:`vitscope.run`).
        distributed: share the pass with the other ``torch.distributed`` processes (:func:`vitscope.run`); rank 0
            alone writes ``out``.

    Returns:
        The :class:`~vitscope.engine.results.Results` of the pass.
    """
    options = AnalyzeOptions(model=model, data=data, analyses=analyses, out=Path(out) if out is not None else None,
                             params=params, batch_size=batch_size, device=device, dtype=dtype, limit=limit,
                             strict=strict, resume=resume, checkpoint_seconds=checkpoint_seconds,
                             figure_files=figure_files, image_size=image_size, keep_aspect=keep_aspect,
                             workers=workers, jpeg_draft=jpeg_draft, compile_stats=compile_stats)
    return run_analyze(options, progress=progress, log=log, distributed=distributed)


@releasing_outputs
def run_analyze(options: AnalyzeOptions, *, progress: bool | None = None, log: Callable[[str], None] | None = None,
                distributed: bool = False) -> Results:
    """One pass of the chosen analyses over the data, every output written to ``options.out`` (when set).

    Args:
        options: what to run (:class:`~vitscope.workflows.options.AnalyzeOptions`, from ``vitscope analyze`` or
            :func:`analyze`).
        progress: progress bars on/off (default: when stderr is a terminal).
        log: receives one-line messages.
        distributed: share the pass with the other ``torch.distributed`` processes; rank 0 alone writes.

    Returns:
        The :class:`~vitscope.engine.results.Results` of the pass.
    """
    check_output(options.out)  # before any work: a wrong --out costs nothing
    options.check_placement()
    model = os.fspath(options.model) if isinstance(options.model, os.PathLike) else options.model
    if not isinstance(model, (str, Backbone)):
        raise VitscopeTypeError(f"the model is a name, a directory or a Backbone, got {type(model).__name__}")
    model_id = model if isinstance(model, str) else model.spec.name
    if isinstance(model, str):
        backbone = load_model(model, image_size=options.image_size, keep_aspect=options.keep_aspect)
    else:
        backbone = model if options.image_size is None else with_image_size(model, options.image_size)
    if options.keep_aspect and not backbone.spec.max_tokens:
        backbone = keeping_aspect(backbone)
    source = as_source(options.data, strict=options.strict)  # the one Source of the run: vitscope.run takes it
    data_facts = DataFacts(source, limit=options.limit)
    chosen = choose_analyses(options.analyses, backbone.spec, data_facts.targets, options.params, data_facts)
    not_run = analyses_not_run(options.analyses, backbone.spec, data_facts.targets, data_facts)
    if log:
        log(describe_input(backbone.spec))
        if not_run:
            log(f"not run: {not_run_text(not_run)}")
    # made once the model, the data and the analyses are known good (a refused run leaves no folder), before the pass
    out = prepare_output(options.out) if options.out is not None else None
    results = run(backbone, source, chosen, batch_size=options.batch_size, device=options.device,
                  dtype=options.dtype, limit=options.limit, strict=options.strict, progress=progress,
                  resume=resume_from(out, model_id, options.resume) if out is not None else None,
                  checkpoint_seconds=options.checkpoint_seconds, log=log, distributed=distributed,
                  workers=options.workers, jpeg_draft=options.jpeg_draft, compile_stats=options.compile_stats)
    yours = {id(a) for a in options.analyses or () if isinstance(a, Analysis)}  # the caller's may be read again
    for analysis in (a for a in chosen if id(a) not in yours):  # their results hold what they computed
        analysis.release_rows()
    if not distributed or is_main_process():
        finish_sae_cards(results, backbone, source, log)
    if out is not None and (not distributed or is_main_process()):
        data = options.data
        outside = analysis_sources(chosen)  # plugin analyses: the code that made their numbers
        config = options.record(model=model_id, data=str(data) if isinstance(data, (str, Path)) else source.name,
                                analyses=[a.name for a in chosen], **({"imports": outside} if outside else {}))
        write_run(out, RunResult(
            "analyze", config=config, results=dict(results),
            models=[{**model_identity(model_id, backbone), "grids": results.grids}],
            data=results.data, num_images=results.num_images, skipped=results.skipped, skipped_analyses=not_run,
            extra={"hooks": results.hooks}, device=describe_device(options.device), **run_record(results)),
            progress=progress, log=log, figure_files=options.figure_files)
        clear_state(out)
    return results


def analyze_command(options: AnalyzeOptions, log: Callable[[str], None] | None = None) -> Path | None:
    """``vitscope analyze``: :func:`run_analyze` in this process's role (under ``torchrun``: its share of the pass).

    Returns:
        The path of results.json (None on the ranks other than 0 of a ``torchrun`` launch: rank 0 writes).
    """
    with role(log) as me:
        run_analyze(options, progress=me.progress, log=me.log, distributed=me.distributed)
    return Path(options.out) / "results.json" if me.main else None
