"""The SAE benchmark's files: ``benchmark.json`` (every number), ``benchmark.md`` (its tables) and ``auroc.png`` (the
held-out AUROC of every method's best unit per concept, :func:`~vitscope.viz.concept_figures.concept_auroc_figure`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from vitscope.atomic import write_text_atomic
from vitscope.sae.concepts import FAMILIES
from vitscope.strict_json import write_json_atomic

__all__ = ["markdown", "write_benchmark"]


def _methods(doc: Mapping[str, Any]) -> list[str]:
    return list(next(iter(doc["models"].values()))["methods"])


def _number(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None or not np.isfinite(value) else f"{value:.{digits}f}"


def _row(cells: list[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    return [_row(header), _row(["---"] * len(header)), *(_row(r) for r in rows), ""]


def _family_tables(doc: Mapping[str, Any], methods: list[str]) -> list[str]:
    """Per model and family: mean AUROC, mean F1, concepts reached with one unit / with the cap, and wins."""
    settings, summary = doc["settings"], doc["summary"]
    lines: list[str] = []
    header = ["model", "family (concepts)", *methods]

    def rows(cell, reference: str | None = None) -> list[list[Any]]:
        found = []
        for model, per_method in summary["families"].items():
            for family in FAMILIES:
                first = per_method[methods[0]][family]
                if first["concepts"]:
                    extra = [_number(summary["references"][model][family][reference])] if reference else []
                    found.append([model, f"{family} ({first['concepts']})",
                                  *(cell(model, per_method[m][family], m, family) for m in methods), *extra])
        return found

    lines += ["## Mean held-out AUROC of the best single unit (context alone: the AUROC of the concept's context, "
              "e.g. the object tokens for a class, as a score)", ""]
    lines += _table([*header, "context alone"], rows(lambda model, s, m, f: _number(s["auroc"]), "context_auroc"))
    lines += ["## Mean held-out AUROC of the same unit within the concept's context (classes and colours among object "
              "tokens, parts among their class's tokens, background types among background tokens)", ""]
    lines += _table(header, rows(lambda model, s, m, f: _number(s["auroc_within"])))
    lines += ["## Mean held-out F1 of the best single unit (threshold set on the fitting tokens; all positive: every "
              "token called positive)", ""]
    lines += _table([*header, "all positive"], rows(lambda model, s, m, f: _number(s["f1"]), "all_positive_f1"))
    lines += [f"## Concepts reaching {settings['target']} AUROC: with one unit / with a read-out of at most "
              f"{settings['cap']} units (median units needed)", ""]
    lines += _table(header, rows(lambda model, s, m, f: f"{s['one_unit']} / {s['reached']} "
                                                        f"({_number(s['median_needed'], 0)})"))
    lines += ["## Concepts won (the highest held-out AUROC at two decimals; ties count for every method tied)", ""]
    lines += _table(header, rows(lambda model, s, m, f: summary["wins"][model][f][m]))
    return lines


def _concept_tables(doc: Mapping[str, Any], methods: list[str]) -> list[str]:
    """One table per model: every concept's AUROC / F1 / units needed per method."""
    lines = ["## Every concept: held-out AUROC / F1 of the best unit / units needed (- : not within the cap)", ""]
    for model, found in doc["models"].items():
        lines += [f"### {model}", ""]
        rows = []
        for concept in doc["concepts"]:
            key = concept["key"]
            counts = found["positives"][key]
            cells = []
            for m in methods:
                r = found["methods"][m]["concepts"][key]
                cells.append("n/a" if r is None else f"{r['auroc']:.2f} / {r['f1']:.2f} / "
                                                     f"{'-' if r['needed'] is None else r['needed']}")
            rows.append([key, f"{counts['fit']} / {counts['heldout']}", *cells])
        lines += _table(["concept", "positive tokens (fitting sample / held-out)", *methods], rows)
    return lines


def markdown(doc: Mapping[str, Any]) -> str:
    """The benchmark's tables as Markdown."""
    s = doc["settings"]
    methods = _methods(doc)
    first = next(iter(doc["models"].values()))
    units = ", ".join(f"{m} {first['methods'][m]['units']}" for m in methods)
    lines = ["# SAE benchmark: concept recovery on the synthetic world", "",
             f"Tokens of `{s['hook']}` (neurons: `{s['neuron_hook']}`) on {s['images']} fitting and {s['heldout']} "
             f"held-out scenes of {s['world']}; a fitting sample of {first['tokens']['fitting_sample']} tokens, "
             f"{first['tokens']['heldout']} held-out tokens. SAE: {s['kind']}, {s['latents']} latents, k {s['k']}, "
             f"{s['tokens']} training tokens, seed {s['seed']}. Units: {units}. PCA, ICA and random directions are "
             f"read with either sign. Took {doc['seconds']:.0f} s.", ""]
    lines += _table(["model", "SAE FVU (held-out)", "L0", "dead latents"],
                    [[m, _number(d["sae"]["fvu"], 3), _number(d["sae"]["l0"], 1), d["sae"]["dead"]]
                     for m, d in doc["models"].items()])
    lines += _family_tables(doc, methods) + _concept_tables(doc, methods)
    return "\n".join(lines)


def write_benchmark(doc: Mapping[str, Any], folder: Path) -> list[Path]:
    """Write ``auroc.png`` (and ``.svg``), ``benchmark.md`` and then ``benchmark.json`` in ``folder``; returns their
    paths, ``benchmark.json`` first."""
    from vitscope.viz.concept_figures import concept_auroc_figure

    folder.mkdir(parents=True, exist_ok=True)
    methods = _methods(doc)
    keys = [c["key"] for c in doc["concepts"]]
    tables = {}
    for model, found in doc["models"].items():
        per = [[np.nan if found["methods"][m]["concepts"][k] is None else found["methods"][m]["concepts"][k]["auroc"]
                for m in methods] for k in keys]
        tables[model] = np.asarray(per, dtype=np.float64)
    # benchmark.json last: a folder holding it holds the tables and the figure of the same run
    paths = concept_auroc_figure(tables, keys, methods, folder / "auroc")
    paths.append(write_text_atomic(folder / "benchmark.md", markdown(doc)))
    return [write_json_atomic(folder / "benchmark.json", doc), *paths]
