"""Files and report sections of a comparison: one figure per quantity, tables of values and best blocks."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from vitscope.compare.curves import QUANTITIES, Comparison, ModelRun
from vitscope.report.captions import caption_for
from vitscope.report.model import FigureItem, Section, Table
from vitscope.report.sections import explorer_of
from vitscope.report.tables import format_cell, rows_table

__all__ = ["comparison_sections", "comparison_summary", "write_comparison"]

_INTRO = {
    "attention_distance": "How far each model's heads look, block by block (mean over heads). Local processing "
                          "(small distances) in early blocks and global processing later is the usual pattern; "
                          "supervision changes where the switch happens.",
    "saliency_iou": "How well attention aligns with the objects (best head per image, 60% mass rule).",
    "clustering_purity": "How well k-means of each block's image features recovers the classes.",
    "knn_accuracy": "k-NN classification from each block's image features (20 neighbours, cosine).",
    "cka_to_reference": "Linear CKA (spatial-mean features of the block outputs) between each model's blocks "
                        "and the reference model's block at the same relative depth; the matrix compares the final "
                        "blocks of every pair of models.",
}


def _long_table(comp: Comparison) -> pd.DataFrame:
    rows = [{"quantity": q, "model": m, "block": b, "relative_depth": x, "value": v}
            for q, per_model in comp.curves.items() for m, c in per_model.items()
            for b, x, v in zip(c.blocks, c.x, c.values)]
    return pd.DataFrame(rows, columns=["quantity", "model", "block", "relative_depth", "value"])


def write_comparison(out: Path, comp: Comparison) -> dict[str, list[str]]:
    """Write ``figures/compare_*.png|svg`` and ``tables/compare_*.csv``; returns their paths relative to ``out``."""
    from vitscope.viz.compare_figures import model_curves
    from vitscope.viz.representation_figures import cka_heatmap

    figures, tables = out / "figures", out / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    made: list[Path] = []
    for quantity, per_model in comp.curves.items():
        label = QUANTITIES[quantity][0].replace("the reference model", comp.reference or "the reference model")
        curves = {m: (c.x, c.values) for m, c in per_model.items()}
        stem = "compare_cka_curve" if quantity == "cka_to_reference" else f"compare_{quantity}"
        made += model_curves(curves, f"{label} per block", label, figures / stem, comp.random.get(quantity),
                             "random attention" if quantity in ("attention_distance", "saliency_iou")
                             else "random chance")
    if comp.cka_matrix is not None:
        made += cka_heatmap(comp.cka_matrix, "CKA between the final blocks of the models",
                            figures / "compare_cka_matrix", comp.cka_models, comp.cka_models, row_title="model",
                            col_title="model")
        pd.DataFrame(comp.cka_matrix.numpy(), index=comp.cka_models, columns=comp.cka_models) \
            .to_csv(tables / "compare_cka_matrix.csv")
        made.append(tables / "compare_cka_matrix.csv")
    _long_table(comp).to_csv(tables / "compare_curves.csv", index=False)
    pd.DataFrame(comp.best_blocks).to_csv(tables / "compare_best_blocks.csv", index=False)
    made += [tables / "compare_curves.csv", tables / "compare_best_blocks.csv"]
    return {"figures": [str(p.relative_to(out)) for p in made if p.parent == figures],
            "tables": [str(p.relative_to(out)) for p in made if p.parent == tables]}


def comparison_summary(comp: Comparison) -> dict[str, Any]:
    """JSON-able summary for results.json: curves per quantity and model, random values, CKA, best blocks."""
    return {
        "curves": {q: {m: {"blocks": c.blocks, "relative_depth": c.x, "values": c.values} for m, c in pm.items()}
                   for q, pm in comp.curves.items()},
        "random": comp.random,
        "cka_reference": comp.reference,
        "cka_models": comp.cka_models,
        "cka_matrix": None if comp.cka_matrix is None else comp.cka_matrix.tolist(),
        "best_blocks": comp.best_blocks,
        "notes": comp.notes,
    }


def _values_table(quantity: str, comp: Comparison) -> Table:
    per_model = comp.curves[quantity]
    depth = max(len(c.values) for c in per_model.values())
    rows = [[m, *(format_cell(v) for v in c.values), *([""] * (depth - len(c.values)))] for m, c in per_model.items()]
    random = comp.random.get(quantity)
    note = f"Random baseline: {format_cell(random)}." if random is not None and not math.isnan(random) else ""
    return Table(f"{QUANTITIES[quantity][0]} per block", ["model", *(f"block {b}" for b in range(depth))], rows, note)


def comparison_sections(out: Path, comp: Comparison, files: Mapping[str, Sequence[str]],
                        runs: Sequence[ModelRun]) -> list[Section]:
    """Report sections: best blocks first, one per quantity (figure + values), then per-model attention maps."""
    figs = {Path(rel).stem: out / rel for rel in files.get("figures", []) if rel.endswith(".png")}

    def figure(stem: str) -> list[FigureItem]:
        if stem not in figs:
            return []
        return [FigureItem(figs[stem], *caption_for(stem))]

    sections = []
    if comp.best_blocks:
        sections.append(Section("best-blocks", "Best block per model", "For each model and quantity, the block "
                                "with the highest score, its value, the last block's value and random chance "
                                "(paper 002, table 1).", tables=[rows_table("Best blocks", comp.best_blocks)]))
    for quantity in QUANTITIES:
        if quantity not in comp.curves:
            continue
        stem = "compare_cka_curve" if quantity == "cka_to_reference" else f"compare_{quantity}"
        figures = figure(stem) + (figure("compare_cka_matrix") if quantity == "cka_to_reference" else [])
        tables = [_values_table(quantity, comp)]
        if quantity == "cka_to_reference" and comp.cka_matrix is not None:
            tables.append(Table("CKA between final blocks", ["model", *comp.cka_models],
                                [[m, *(format_cell(v) for v in row)] for m, row in
                                 zip(comp.cka_models, comp.cka_matrix.tolist())]))
        title = QUANTITIES[quantity][0].replace("the reference model", comp.reference or "the reference model")
        sections.append(Section(f"compare-{quantity}", title.capitalize(), _INTRO[quantity], figures, tables))
    explorers = []
    for run in runs:
        for name in ("cls_attention_maps", "spatial_average_maps"):
            if name in run.results:
                ex = explorer_of(run.results[name], f"{run.model_id}: {run.results[name].meta.get('what', name)}",
                                 max_images=2)
                if ex is not None:
                    explorers.append(ex)
    if explorers:
        sections.append(Section("attention-maps", "Attention maps per model", "Block x head explorers of every "
                                "transformer (CNNs have no attention).", explorers=explorers))
    if comp.notes:
        sections.append(Section("notes", "Notes", " ".join(comp.notes)))
    return sections
