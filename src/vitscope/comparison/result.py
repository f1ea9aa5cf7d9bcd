"""``ComparisonResult``: a comparison of models as a typed result (summary, tables, figures with captions)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from vitscope.analyses.result import Figure, Result
from vitscope.comparison.curves import QUANTITIES, Comparison
from vitscope.viz.labels import sentence_case
from vitscope.viz.ranges import quantity_range

__all__ = ["CAPTIONS", "ComparisonResult", "figure_stem"]

#: quantity -> (caption, paper figure) of its curves; ``cka_matrix``: the model x model matrix
CAPTIONS: dict[str, tuple[str, str]] = {
    "attention_distance": ("Mean attention distance per block for every model (relative depth on the x axis so "
                           "models of different depth share it), each with its own random-attention baseline "
                           "(dashed, in the model's colour: it depends on the token grid).", "paper 002, fig. 4"),
    "saliency_iou": ("Best-head saliency IoU per block for every model, each with its own random-attention baseline "
                     "(dashed, in the model's colour: it depends on the token grid).", "paper 002, fig. 5"),
    "clustering_purity": ("Clustering purity of image features per block for every model.", "paper 002, fig. 7"),
    "knn_accuracy": ("k-NN accuracy per block for every model.", "paper 002, fig. 9 (left)"),
    "cka_to_reference": ("CKA of every model's blocks with the first model's block at the same relative depth.",
                         "paper 002, fig. 6 (per block)"),
    "cka_matrix": ("CKA between the final-block features of every pair of models.", "paper 002, fig. 6 and 19"),
    "outlier_fraction": ("Share of patch tokens that are high-norm outliers after each block, for every model "
                         "(each with its own threshold).", "Darcet et al. 2024, Vision Transformers Need Registers"),
}


def figure_stem(quantity: str) -> str:
    """The figure file stem of a quantity's curves."""
    return "compare_cka_curve" if quantity == "cka_to_reference" else f"compare_{quantity}"


class ComparisonResult(Result):
    """A :class:`~vitscope.comparison.curves.Comparison` as a result named ``compare``."""

    def __init__(self, comparison: Comparison) -> None:
        models = list(dict.fromkeys(m for per_model in comparison.curves.values() for m in per_model))
        super().__init__("compare", {}, {}, intro=f"{', '.join(models)} over the same images, block by block "
                         "(relative depth on the x axis, so models of different depth share it).")
        self.comparison = comparison

    def to_json(self) -> dict[str, Any]:
        """Curves per quantity and model, random values, CKA, best blocks, the probes' settings and notes."""
        comp = self.comparison
        return {
            "curves": {q: {m: {"blocks": c.blocks, "relative_depth": c.x, "values": c.values} for m, c in pm.items()}
                       for q, pm in comp.curves.items()},
            "random": comp.random,
            "cka": comp.cka,
            "cka_reference": comp.reference,
            "cka_models": comp.cka_models,
            "cka_matrix": None if comp.cka_matrix is None else comp.cka_matrix.tolist(),
            "best_blocks": comp.best_blocks,
            "probe_settings": comp.probe_settings,
            "notes": comp.notes,
        }

    def tables(self) -> dict[str, Any]:
        comp = self.comparison
        rows = [{"quantity": q, "model": m, "block": b, "relative_depth": x, "value": v}
                for q, per_model in comp.curves.items() for m, c in per_model.items()
                for b, x, v in zip(c.blocks, c.x, c.values)]
        out = {"compare_curves": pd.DataFrame(rows, columns=["quantity", "model", "block", "relative_depth", "value"]),
               "compare_best_blocks": pd.DataFrame(comp.best_blocks)}
        if comp.cka_matrix is not None:
            matrix = pd.DataFrame(comp.cka_matrix.numpy(), columns=comp.cka_models)
            matrix.insert(0, "model", comp.cka_models, allow_duplicates=True)  # a model may be named "model"
            out["compare_cka_matrix"] = matrix
        return out

    def arrays(self) -> dict[str, Any]:
        return {}

    def figures(self) -> list[Figure]:
        """One figure per quantity (every model's curve over relative depth, each model's own random baseline
        dashed in its colour) and the CKA matrix of the final blocks."""
        from vitscope.viz.charts import Curve, block_head_chart, depth_lines_chart

        comp, out = self.comparison, []
        for quantity, per_model in comp.curves.items():
            label = QUANTITIES[quantity][0].replace("the reference model", comp.reference or "the reference model")
            curves = {m: (c.x, c.values) for m, c in per_model.items()}
            baselines = {m: v for m, v in comp.random.get(quantity, {}).items() if m in per_model}
            kind = "random attention" if quantity in ("attention_distance", "saliency_iou") else "random chance"

            def draw(path: Path, curves=curves, label=label, baselines=baselines, kind=kind,
                     quantity=quantity) -> list[Path]:
                from vitscope.viz.comparison_figures import model_curves

                return model_curves(curves, f"{label} per block", label, path, baselines, kind,
                                    value_range=quantity_range(quantity))

            lines = []
            for m, c in per_model.items():
                lines.append(Curve(m, [_finite(v) for v in c.values], m, "line", list(c.x)))
                if m in baselines and _finite(baselines[m]) is not None:
                    lines.append(Curve(m, [baselines[m]] * 2, m, "dashed", [0.0, 1.0]))
            dashed = any(c.style == "dashed" for c in lines)  # say so only where a baseline is drawn
            chart = depth_lines_chart(lines, label, f"{label} per block" + (f" (dashed: each model's {kind})"
                                                                            if dashed else ""),
                                      quantity_range(quantity) or (None, None))
            out.append(Figure(figure_stem(quantity), draw, sentence_case(f"{label} per block"), *CAPTIONS[quantity],
                              chart=chart))
        if comp.cka_matrix is not None:
            def matrix(path: Path) -> list[Path]:
                from vitscope.viz.representation_figures import cka_heatmap

                return cka_heatmap(comp.cka_matrix, "CKA between the final blocks of the models", path,
                                   comp.cka_models, comp.cka_models, row_title="model", col_title="model")

            chart = block_head_chart(comp.cka_matrix, "linear CKA", comp.cka_models, "CKA between the final blocks",
                                     x_label="model", y_label="model", column_labels=comp.cka_models,
                                     value_range=quantity_range("cka"))
            out.append(Figure("compare_cka_matrix", matrix, "CKA between final blocks", *CAPTIONS["cka_matrix"],
                              chart=chart))
        return out


def _finite(v: float) -> float | None:
    return float(v) if v is not None and math.isfinite(v) else None
