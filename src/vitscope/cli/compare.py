"""``vitscope compare``: run every model once over the data, then compare them per block on shared axes."""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import vitscope
from vitscope.cli.analyze import (
    checkpoint_for,
    clear_state,
    config_record,
    dataset_targets,
    describe_data,
    environment,
    write_results_json,
)
from vitscope.compare import ModelRun, compare_analyses, compare_runs
from vitscope.compare.outputs import comparison_sections, comparison_summary, write_comparison
from vitscope.data.open import open_dataset
from vitscope.engine.provenance import model_identity
from vitscope.engine.run import run
from vitscope.models.load import load_model
from vitscope.report.model import Report
from vitscope.report.sections import summary_rows

__all__ = ["CompareOutput", "compare", "run_compare"]


@dataclass
class CompareOutput:
    """What a comparison produced: the results.json document, the report (not yet written) and the folder."""

    out: Path
    doc: dict[str, Any]
    report: Report


def run_compare(options: Mapping[str, Any], progress: bool | None = None,
                log: Callable[[str], None] | None = None) -> CompareOutput:
    """Run each model once (resumably), compare, write figures, tables and results.json (not the report).

    Args:
        options: resolved options (:data:`vitscope.cli.config.COMPARE_OPTIONS`).
        progress: force the progress bars on/off.
        log: receives one-line messages.
    """
    models = list(options["models"])
    if len(models) < 2:
        raise ValueError("compare needs at least two models, e.g. --models tiny-vit-sup,tiny-vit-mae")
    dupes = sorted({m for m in models if models.count(m) > 1})
    if dupes:
        raise ValueError(f"model {dupes[0]!r} is listed twice in --models; list each model once")
    out = Path(options["out"])
    dataset = open_dataset(options["data"], strict=bool(options.get("strict")))
    targets = dataset_targets(dataset)
    data = describe_data(dataset)
    runs, identities, counts, skipped = [], [], {}, {}
    for model_id in models:  # one at a time: only one model is in memory (a failed name resumes cheaply)
        backbone = load_model(model_id)
        analyses = compare_analyses(backbone.spec, targets)
        checkpoint = checkpoint_for(out, model_id, backbone, data["fingerprint"], analyses, options, log)
        results = run(backbone, dataset, analyses, batch_size=options["batch_size"], device=options.get("device"),
                      dtype=options.get("dtype"), limit=options.get("limit"), strict=bool(options.get("strict")),
                      progress=progress, checkpoint=checkpoint)
        runs.append(ModelRun(model_id, backbone.spec, dict(results.items())))
        identities.append(model_identity(model_id, backbone))
        counts[model_id] = results.num_images
        skipped.update((s.path, {"path": s.path, "reason": s.reason}) for s in results.skipped)
        del backbone
        gc.collect()
    comparison = compare_runs(runs)
    files = write_comparison(out, comparison)
    doc = {
        "vitscope_version": vitscope.__version__,
        "config": config_record(options),
        "models": identities,
        "data": data,
        "num_images": max(counts.values()),
        "images_per_model": counts,
        "skipped": list(skipped.values()),
        "analyses": {"compare": {"summary": comparison_summary(comparison), "files": files}},
        "environment": environment(),
    }
    write_results_json(out, doc)
    report = Report(title=f"vitscope compare: {', '.join(models)}", subtitle=f"data: {data.get('name', '')}",
                    summary=summary_rows(doc), config=dict(doc["config"]),
                    sections=comparison_sections(out, comparison, files, runs), notes=list(comparison.notes))
    return CompareOutput(out, doc, report)


def compare(options: Mapping[str, Any], progress: bool | None = None,
            log: Callable[[str], None] | None = None) -> Path:
    """:func:`run_compare`, then write report.html and drop the saved state; returns results.json's path."""
    from vitscope.report import write_report

    result = run_compare(options, progress, log)
    write_report(result.report, result.out / "report.html")
    clear_state(result.out)
    return result.out / "results.json"
