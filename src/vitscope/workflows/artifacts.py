"""``vitscope artifacts``: the artifacts analysis in one pass, then every ablation of what it found beside its
controls and the test-time register, written like every command's outputs."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from vitscope.outputs.folder import check_output
from vitscope.outputs.lock import releasing_outputs

__all__ = ["run_artifacts"]

ABLATIONS_INTRO = ("The outliers (at the first block that shows them) and the registers replaced by zero, by their "
                   "mean over the data's first images and by another image's tokens, and the test-time register "
                   "(Jiang et al. 2025), each read on the model's output and on a k-NN probe of the last block: "
                   "zeroing alone overstates an effect (Darcet et al. 2024, Sun et al. 2024).")


@releasing_outputs
def run_artifacts(model: str, data: str, out: Path, params: Mapping[str, Mapping[str, str]] | None = None,
                  ablations: bool = True, limit: int | None = None, batch_size: int = 16, images: int = 32,
                  log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Diagnose ``model``'s artifacts on ``data`` and, with ``ablations``, what they do.

    Args:
        model: a registered name, ``hf:<id>`` or a model folder; data: anything ``vitscope.run`` reads (labels for
            the ablations' k-NN probe).
        out: the output folder; params: ``{"artifacts": {parameter: text}}`` (``--param artifacts.threshold=150``).
        ablations: run the ablations and the test-time register after the diagnosis.
        limit: images of the diagnosis and of the ablations' passes; batch_size: of every pass.
        images: images the ablations' output change is measured on.
        log: receives one-line messages (the model's input: size, token grid, preprocessing; the ablations).

    Returns:
        The written results.json.
    """
    check_output(out)  # before any work: a wrong --out costs nothing
    import pandas as pd

    from vitscope.analyses.data_checks import DataFacts
    from vitscope.analyses.params import build_analyses
    from vitscope.analyses.result import SummaryResult
    from vitscope.data.open import as_source
    from vitscope.engine.provenance import model_identity
    from vitscope.engine.run import run
    from vitscope.experiments.artifacts import artifact_ablations
    from vitscope.models.input_size import describe_input
    from vitscope.models.load import load_model
    from vitscope.outputs import RunResult, prepare_output, write_run

    backbone = load_model(model)
    if log:
        log(describe_input(backbone.spec))
    source = as_source(data)
    facts = DataFacts(source, limit=limit)
    chosen = build_analyses(["artifacts"], backbone.spec, facts.targets, params, data=facts)
    out = prepare_output(out)  # once the model and the data are known good: a refused run leaves no folder
    results = run(backbone, source, chosen, batch_size=batch_size, limit=limit, progress=None, log=log)
    found = results["artifacts"]
    written: dict[str, Any] = {"artifacts": found}
    not_run: dict[str, str] = {}
    problem = facts.class_problem() if ablations and "label" in facts.targets else None
    if ablations and "label" not in facts.targets:
        not_run["artifact_ablations"] = "the data has no labels, which the ablations' k-NN probe needs"
    elif problem:  # the diagnosis stands without them
        not_run["artifact_ablations"] = f"the ablations' k-NN probe cannot score this data: {problem}"
    elif ablations:
        if log:
            log("ablations: outliers and registers by zero, mean and another image's tokens; the test-time register")
        subset = source if limit is None else _first(source, limit)
        rows = artifact_ablations(backbone, subset, found.meta, images=images, batch_size=batch_size,
                                  not_run=not_run)
        table = pd.DataFrame(rows)
        summary = {"rows": json.loads(table.to_json(orient="records"))}
        _note_nulls(summary, table, backbone.spec)
        written["artifact_ablations"] = SummaryResult("artifact_ablations", summary,
                                                      tables={"artifact_ablations": table}, intro=ABLATIONS_INTRO)
    path = write_run(out, RunResult(
        "artifacts", title=f"vitscope artifacts: {model}",
        config={"command": "artifacts", "model": model, "data": str(data), "params": {k: dict(v) for k, v in (
            params or {}).items()}, "ablations": ablations, "limit": limit, "batch_size": batch_size,
                "images": images},
        results=written, models=[{**model_identity(model, backbone), "grids": results.grids}], data=results.data,
        num_images=results.num_images, skipped=results.skipped, skipped_analyses=not_run))
    return json.loads(Path(path).read_text())


def _note_nulls(summary: dict[str, Any], table: Any, spec: Any) -> None:
    """Say in ``summary`` why columns of the ablations ``table`` hold nulls: a model without a CLS token has no CLS
    attention to measure; a row of a model without registers has none to receive it (but the test-time
    register's)."""
    from vitscope.analyses.attention.base import has_cls_token
    from vitscope.strict_json import note_null

    has_cls = has_cls_token(spec)
    if not has_cls:
        note_null(summary, "rows.cls_to_outliers", "the model has no CLS token")
    if "cls_to_registers" in table and table["cls_to_registers"].isna().any():
        note_null(summary, "rows.cls_to_registers", "the model has no register tokens" if has_cls
                  else "the model has no CLS token")


def _first(source: Any, limit: int) -> Any:
    """The first ``limit`` images of ``source`` (the ablations' passes read no more than the diagnosis)."""
    from vitscope.data.source_part import SourcePart

    return SourcePart(source, range(min(limit, len(source))))
