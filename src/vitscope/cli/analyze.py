"""``vitscope analyze``: run analyses over a dataset (resumably) and write results.json, tables, figures, report."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from vitscope.engine.run import Results

STATE_DIR = ".vitscope-state"


def dataset_targets(dataset) -> frozenset[str]:
    """Ground-truth keys the data hands to analyses (``batch.targets``): none for plain image folders,
    e.g. ``label`` and ``masks`` for annotated formats (``ROOT::coco``)."""
    return dataset.target_keys()


def parse_analyses(names: str | None, spec, targets: frozenset[str] | None = None,
                   params: dict[str, dict[str, Any]] | None = None) -> list:
    """Comma-separated analysis or group names -> configured instances
    (:func:`vitscope.workflows.analyze.choose_analyses`)."""
    from vitscope.workflows.analyze import choose_analyses

    return choose_analyses(names, spec, frozenset(targets or ()), params)


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




def analyze(options: Mapping[str, Any], progress: bool | None = None,
            log: Callable[[str], None] | None = None) -> Path:
    """``vitscope analyze``: :func:`vitscope.workflows.analyze.analyze` with the resolved options.

    Returns:
        The path of results.json.
    """
    from vitscope.workflows.analyze import analyze as analyze_data

    out = Path(options["out"])
    analyze_data(options["model"], options["data"], options.get("analyses"), out=out, params=options.get("params"),
                 batch_size=options["batch_size"], device=options.get("device"), dtype=options.get("dtype"),
                 limit=options.get("limit"), strict=bool(options.get("strict")), resume=options.get("resume", True),
                 checkpoint_seconds=float(options.get("checkpoint_seconds", 60.0)), progress=progress, log=log,
                 config=options)
    return out / "results.json"
