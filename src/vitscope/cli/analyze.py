"""``vitscope analyze``: run analyses over a dataset and write results.json, tables and figures."""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

import vitscope
from vitscope.analyses.attention_suite import ATTENTION_GROUP, attention_suite, link_attention_plans
from vitscope.analyses.registry import ANALYSES, GROUPS, default_analyses, get_analysis
from vitscope.data.images import open_dataset
from vitscope.engine.run import Results, run
from vitscope.models.load import load_model


def dataset_targets(dataset) -> frozenset[str]:
    """Ground-truth keys the dataset hands to analyses (``batch.targets``), read from its first entries.

    Plain image folders have none; annotated formats (``ROOT::coco``) give e.g. ``label`` and ``masks``.
    """
    probe = getattr(dataset, "_targets", None)
    if probe is None:
        return frozenset()
    for i in range(min(len(dataset), 3)):
        try:
            return frozenset(probe(i))
        except Exception:  # an unreadable entry: try the next one
            continue
    return frozenset()


def _expand(name: str, spec, targets: frozenset[str]) -> list:
    if name == ATTENTION_GROUP:
        return attention_suite(spec, targets)
    if name in GROUPS:
        return [get_analysis(member) for member in GROUPS[name]]
    return [get_analysis(name)]


def parse_analyses(names: str | None, spec, targets: frozenset[str] | None = None) -> list:
    """Comma-separated analysis or group names -> instances (None: every analysis the model and data support).

    ``attention`` expands to the attention suite (saliency only when the data has masks). Explicitly named
    analyses that cannot run fail here with a one-line reason (a CNN has no attention; saliency needs masks).
    """
    targets = frozenset(targets or ())
    if not names:
        return default_analyses(spec, targets)
    chosen, seen = [], set()
    for name in (n.strip() for n in names.split(",")):
        for a in _expand(name, spec, targets) if name else []:
            if a.name not in seen:
                seen.add(a.name)
                chosen.append(a)
    for a in chosen:
        reason = a.why_unsupported(spec) if hasattr(a, "why_unsupported") else None
        if reason:
            raise ValueError(reason)
        missing = sorted(set(getattr(a, "required_targets", ())) - targets)
        if missing:
            raise ValueError(f"analysis '{a.name}' needs ground truth {', '.join(missing)}, which this data does "
                             "not provide; use an annotated dataset (e.g. --data ROOT::coco) or leave it out")
    return link_attention_plans(chosen)


def write_outputs(out: Path, results: Results, config: dict[str, Any], backbone, dataset) -> Path:
    """Write ``results.json``, ``tables/*.csv|json`` and ``figures/*.png|svg`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    tables, figures = out / "tables", out / "figures"
    files: dict[str, dict[str, list[str]]] = {}
    for name, result in results.items():
        saved = result.save(tables)
        plotted = result.plot(figures)
        files[name] = {"tables": [str(p.relative_to(out)) for p in saved],
                       "figures": [str(p.relative_to(out)) for p in plotted]}
    doc = {
        "vitscope_version": vitscope.__version__,
        "config": config,
        "models": [backbone.spec.to_dict()],
        "data": dataset.describe() if hasattr(dataset, "describe") else {"name": str(dataset)},
        "num_images": results.num_images,
        "skipped": [{"path": s.path, "reason": s.reason} for s in results.skipped],
        "hooks": results.hooks,
        "analyses": {name: {"summary": r.summary(), "files": files[name]} for name, r in results.items()},
        "environment": {"python": platform.python_version(), "torch": _torch_version()},
    }
    path = out / "results.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)  # atomic: a reader never sees half a file
    return path


def _torch_version() -> str:
    import torch

    return torch.__version__


def analyze(model: str, data: str, out: Path, analyses: str | None, limit: int | None, batch_size: int,
            device: str | None, dtype: str | None, strict: bool, progress: bool | None = None) -> Path:
    """Load, run and write; returns the path of results.json."""
    backbone = load_model(model)
    dataset = open_dataset(data, strict=strict)
    chosen = parse_analyses(analyses, backbone.spec, dataset_targets(dataset))
    if not chosen:
        raise ValueError(f"no analysis supports {backbone.spec.name}; known: {', '.join(ANALYSES)}")
    results = run(backbone, dataset, chosen, batch_size=batch_size, device=device, dtype=dtype, limit=limit,
                  strict=strict, progress=progress)
    config = {"model": model, "data": data, "analyses": [a.name for a in chosen], "limit": limit,
              "batch_size": batch_size, "device": device or "auto", "dtype": dtype or "fp32", "strict": strict}
    return write_outputs(out, results, config, backbone, dataset)
