"""Report sections of a comparison: best blocks, one section per quantity (its figure and values), attention maps."""

from __future__ import annotations

from collections.abc import Sequence

from vitscope.comparison.curves import QUANTITIES, Comparison, ModelRun
from vitscope.comparison.result import figure_stem
from vitscope.report.model import Section, Table
from vitscope.report.sections import explorer_of
from vitscope.report.tables import format_cell, rows_table
from vitscope.viz.labels import sentence_case

__all__ = ["comparison_sections"]

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
    "outlier_fraction": "The share of patch tokens that are high-norm outliers after each block (the artifacts "
                        "analysis's threshold per model): a model with registers should have fewer than its twin "
                        "without (Darcet et al. 2024).",
}


def _values_table(quantity: str, comp: Comparison) -> Table:
    per_model = comp.curves[quantity]
    depth = max(len(c.values) for c in per_model.values())
    random = comp.random.get(quantity, {})
    rows = [[m, *(format_cell(v) for v in c.values), *([""] * (depth - len(c.values)))] for m, c in per_model.items()]
    columns = ["model", *(f"block {b}" for b in range(depth))]
    note = ""
    if random:  # each model's own baseline (it depends on the token grid); "" where a model has none
        columns.append("random")
        rows = [row + [format_cell(random[m]) if m in random else ""] for row, m in zip(rows, per_model)]
        note = "The last column is each model's own random baseline (it depends on the model's token grid)."
    return Table(f"{QUANTITIES[quantity][0]} per block", columns, rows, note)


#: the quantities the probes' settings table goes with
_PROBED = ("clustering_purity", "knn_accuracy")


def _settings_table(comp: Comparison) -> Table:
    """How the clustering and k-NN curves were made: each model's pooled token, k-means clusters and k-NN split,
    and the settings they share (seed, held-out share, k and temperature) in the note."""
    settings = comp.probe_settings
    rows = [[m, s.get("pooling", ""), format_cell(s.get("clusters")), format_cell(s.get("num_train", "")),
             format_cell(s.get("num_test", ""))] for m, s in settings.get("models", {}).items()]
    knn = settings.get("knn")
    note = f"Seed {settings.get('seed')} (k-means, the k-NN split and the random baselines)" + (
        f"; k-NN: k = {knn['k']} neighbours, temperature {knn['temperature']}, {settings.get('test_fraction')} of the "
        "images held out by a seeded hash of their index." if knn else ".")
    return Table("Probe settings", ["model", "pooled token", "k-means clusters", "k-NN train images",
                                    "k-NN test images"], rows, note)


def comparison_sections(comp: Comparison, runs: Sequence[ModelRun]) -> list[Section]:
    """Report sections: best blocks first, one per quantity (figure + values), then per-model attention maps.

    Figures are named by the stems of :class:`~vitscope.comparison.result.ComparisonResult`'s figures (the writer
    draws them once and puts them here)."""
    sections = []
    if comp.best_blocks:
        sections.append(Section("best-blocks", "Best block per model", "For each model and quantity, the block "
                                "with the highest score, its value, the last block's value and random chance "
                                "(paper 002, table 1).", tables=[rows_table("Best blocks", [
                                    {**row, "quantity": QUANTITIES[row["quantity"]][0]} if row.get("quantity") in
                                    QUANTITIES else row for row in comp.best_blocks])]))  # named as the charts are
    for quantity in QUANTITIES:
        if quantity not in comp.curves:
            continue
        figures = [figure_stem(quantity)] + (["compare_cka_matrix"] if quantity == "cka_to_reference" and
                                             comp.cka_matrix is not None else [])
        tables = [_values_table(quantity, comp)]
        if quantity in _PROBED and comp.probe_settings:
            tables.append(_settings_table(comp))
        if quantity == "cka_to_reference" and comp.cka_matrix is not None:
            tables.append(Table("CKA between final blocks", ["model", *comp.cka_models],
                                [[m, *(format_cell(v) for v in row)] for m, row in
                                 zip(comp.cka_models, comp.cka_matrix.tolist())]))
        title = QUANTITIES[quantity][0].replace("the reference model", comp.reference or "the reference model")
        sections.append(Section(f"compare-{quantity}", sentence_case(title), _INTRO[quantity], figures, tables))
    explorers = []
    for run in runs:
        for name, result in run.results.items():
            maps = result.explorer_maps()  # a result that declares an explorer
            if maps is not None:
                what = maps.what if name == result.base_name else f"{maps.what} ({name})"
                explorers.append(explorer_of(result, f"{run.label}: {what}", max_images=len(maps.image_names)))
    if explorers:
        sections.append(Section("attention-maps", "Attention maps per model", "Block x head explorers of every "
                                "transformer (CNNs have no attention).", explorers=explorers))
    if comp.notes:
        sections.append(Section("notes", "Notes", " ".join(comp.notes)))
    return sections
