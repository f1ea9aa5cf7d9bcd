"""The report sections of ``vitscope featviz``, built from its results (figures named by their stems)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vitscope.report.model import Section, Table

__all__ = ["featviz_sections"]


def featviz_sections(results: Mapping[str, Any]) -> list[Section]:
    """Sections for the feature-visualisation results (the writer draws the figures and puts them here)."""
    sections = []
    fv = results.get("featviz")
    if fv is not None:
        units = fv.meta["units"]
        figures: list[Any] = ["featviz_grid"]
        figures += [f.stem for f in fv.figures() if f.stem.startswith("panel_")]
        rows = [[name, u["activation"], u.get("best_dataset_score", ""), u["final_loss"]] for name, u in units.items()]
        sections.append(Section(
            id="featviz", title="Feature visualisation",
            intro="Images optimised to maximise each unit (mean over spatial tokens of one channel) with the published "
                  "recipe of paper 001: 8 augmented copies, ColorShift, annealed noise, circular jitter, total "
                  "variation, Adam with a cosine schedule.", figures=figures,
            tables=[Table("Units", ["unit", "activation of optimised image", "best dataset image", "final loss"], rows,
                          note="Activation = the unit's objective on the un-augmented optimised image.")]))
    tm = results.get("token_mixing")
    if tm is not None and tm.meta.get("num_images"):
        m = tm.meta
        rows = [["model (CLS)", m["model_accuracy"]], ["head on patch tokens, average", m["patch_average"]],
                ["head on patch tokens, best patch", m["patch_maximum"]],
                ["head on the mean patch token", m["mean_patch_token_accuracy"]]]
        rows += [[f"CLS inserted at block {b}", a] for b, a in m["isolate_cls"].items()]
        sections.append(Section(
            id="token-mixing", title="Last-layer token mixing",
            intro="The classifier head applied to every token without fine-tuning, and CLS isolated from the patches "
                  "until block L (paper 001 section 4).", figures=[f.stem for f in tm.figures()],
            tables=[Table("Accuracy", ["setting", "accuracy"], rows, note="paper 001, table 1")]))
    si = results.get("spatial_information")
    if si is not None:
        m = si.meta
        rows = [[f"block {b}", used, (lin or {}).get("r2", "")]
                for b, used, lin in zip(range(len(m["units_used"])), m["units_used"], m["linearity"])]
        sections.append(Section(
            id="spatial-information", title="Spatial information in single channels",
            intro="For random FFN channels of every block, a growing fraction of each unit's active patches is blacked "
                  "out in its most-activating images; the ratio of active patches (count and sum) is plotted against "
                  "that fraction (paper 001 appendix F).", figures=["spatial_information"],
            tables=[Table("Units per block", ["block", "units with an active patch", "linearity"], rows)]))
    return sections
