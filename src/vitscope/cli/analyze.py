"""``vitscope analyze``: run analyses over a dataset (resumably) and write results.json, tables, figures, report."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import vitscope
from vitscope.analyses.attention_suite import ATTENTION_GROUP, NoAttentionError
from vitscope.analyses.params import build_analyses
from vitscope.analyses.registry import ANALYSES, default_analyses
from vitscope.data.open import open_dataset
from vitscope.engine.provenance import model_identity
from vitscope.engine.run import Results, resolve_device, run
from vitscope.engine.state import Checkpoint, run_key
from vitscope.features.fingerprint import model_fingerprint
from vitscope.models.load import load_model

STATE_DIR = ".vitscope-state"


def dataset_targets(dataset) -> frozenset[str]:
    """Ground-truth keys the data hands to analyses (``batch.targets``): none for plain image folders,
    e.g. ``label`` and ``masks`` for annotated formats (``ROOT::coco``)."""
    return dataset.target_keys()


def parse_analyses(names: str | None, spec, targets: frozenset[str] | None = None,
                   params: dict[str, dict[str, Any]] | None = None) -> list:
    """Comma-separated analysis or group names (``NAME@TAG`` for a labelled instance) -> configured instances.

    None selects every default analysis the model and data support. A group expands to its members that can
    run (``attention``: saliency only when the data has masks); explicitly named analyses that cannot run fail
    here with a one-line reason (a CNN has no attention; saliency needs masks). ``params`` configures them
    (:func:`vitscope.analyses.params.build_analyses`).
    """
    targets = frozenset(targets or ())
    if names and any(n.strip() == ATTENTION_GROUP for n in names.split(",")) and not spec.is_transformer:
        raise NoAttentionError(f"the attention analyses need attention patterns, but {spec.name} is a CNN and "
                               "has no attention; use a transformer or other analyses")
    selection = names.split(",") if names else [a.name for a in default_analyses(spec, targets)]
    return build_analyses(selection, spec, targets, params)


def describe_data(dataset) -> dict[str, Any]:
    """The data entry of results.json: the source's own description plus its fingerprint."""
    return {**dataset.describe(), "fingerprint": dataset.fingerprint()}


def write_results_json(out: Path, doc: dict[str, Any]) -> Path:
    """Write ``results.json`` atomically (a reader never sees half a file)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    tmp = path.with_name(".results.json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    os.replace(tmp, path)
    return path


def save_result_files(out: Path, results: Results, prefix: str = "") -> dict[str, dict[str, list[str]]]:
    """Write every result's tables and figures under ``out/tables`` and ``out/figures`` (``prefix`` groups them
    per model in a comparison); returns ``{name: {"tables": [...], "figures": [...]}}`` relative to ``out``."""
    tables, figures = out / "tables" / prefix, out / "figures" / prefix
    files: dict[str, dict[str, list[str]]] = {}
    for name, result in results.items():
        files[name] = {"tables": [str(p.relative_to(out)) for p in result.save(tables)],
                       "figures": [str(p.relative_to(out)) for p in result.plot(figures)]}
    return files


def environment() -> dict[str, str]:
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__}


def write_outputs(out: Path, results: Results, config: dict[str, Any], models: list[dict[str, Any]],
                  data: dict[str, Any], resumed_images: int = 0) -> dict[str, Any]:
    """Write ``results.json``, ``tables/*.csv|json`` and ``figures/*.png|svg`` into ``out``; returns the document."""
    files = save_result_files(out, results)
    doc = {
        "vitscope_version": vitscope.__version__,
        "config": config,
        "models": models,
        "data": data,
        "num_images": results.num_images,
        "skipped": [{"path": s.path, "reason": s.reason} for s in results.skipped],
        "hooks": results.hooks,
        "analyses": {name: {"summary": r.summary(), "files": files[name]} for name, r in results.items()},
        "environment": environment(),
        "run": {"resumed_images": resumed_images},
    }
    write_results_json(out, doc)
    return doc


def state_path(out: Path, model_id: str) -> Path:
    """Where the resumable state of ``model_id``'s pass lives inside the output folder."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model_id).strip("._") or "model"
    return out / STATE_DIR / f"{safe}.pt"


def checkpoint_for(out: Path, model_id: str, backbone, fingerprint: dict[str, Any], analyses: list,
                   options: Mapping[str, Any], log: Callable[[str], None] | None) -> Checkpoint | None:
    """The Checkpoint of one model's pass (None when ``resume`` is off: any old state is then removed)."""
    path = state_path(out, model_id)
    if not options.get("resume", True):
        path.unlink(missing_ok=True)
        return None
    key = run_key(model_fingerprint(backbone), backbone.spec.to_dict(), fingerprint, analyses,
                  batch_size=options["batch_size"], limit=options.get("limit"), strict=bool(options.get("strict")),
                  device=resolve_device(options.get("device")).type, dtype=options.get("dtype") or "fp32")
    return Checkpoint(path, key, every_seconds=float(options.get("checkpoint_seconds", 60.0)), log=log)


def clear_state(out: Path) -> None:
    """Remove the state folder once every output is written."""
    shutil.rmtree(out / STATE_DIR, ignore_errors=True)


def config_record(options: Mapping[str, Any], **resolved: Any) -> dict[str, Any]:
    """The resolved configuration as stored in results.json (paths as strings, choices made explicit)."""
    record = {k: (str(v) if isinstance(v, Path) else v) for k, v in options.items()}
    record["device"] = record.get("device") or "auto"
    record["dtype"] = record.get("dtype") or "fp32"
    record.update(resolved)
    return record


def analyze(options: Mapping[str, Any], progress: bool | None = None,
            log: Callable[[str], None] | None = None) -> Path:
    """Load, run (resuming saved state), write results.json, tables, figures and report.html.

    Args:
        options: resolved options (:data:`vitscope.cli.config.ANALYZE_OPTIONS`).
        progress: force the progress bar on/off.
        log: receives one-line messages (resuming, ignored state).

    Returns:
        The path of results.json.
    """
    from vitscope.report import analyze_report, write_report

    out = Path(options["out"])
    backbone = load_model(options["model"])
    dataset = open_dataset(options["data"], strict=bool(options.get("strict")))
    names = ",".join(options["analyses"]) if options.get("analyses") else None
    chosen = parse_analyses(names, backbone.spec, dataset_targets(dataset), options.get("params"))
    if not chosen:
        raise ValueError(f"no analysis supports {backbone.spec.name}; known: {', '.join(ANALYSES)}")
    data = describe_data(dataset)
    checkpoint = checkpoint_for(out, options["model"], backbone, data["fingerprint"], chosen, options, log)
    results = run(backbone, dataset, chosen, batch_size=options["batch_size"], device=options.get("device"),
                  dtype=options.get("dtype"), limit=options.get("limit"), strict=bool(options.get("strict")),
                  progress=progress, checkpoint=checkpoint)
    config = config_record(options, analyses=[a.name for a in chosen])
    doc = write_outputs(out, results, config, [model_identity(options["model"], backbone)], data,
                        resumed_images=checkpoint.resumed_images if checkpoint else 0)
    write_report(analyze_report(out, doc, results), out / "report.html")
    clear_state(out)
    return out / "results.json"

