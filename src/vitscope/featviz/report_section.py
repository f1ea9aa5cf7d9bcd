"""report.html of ``vitscope featviz``, built from the report package's plain data classes."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vitscope.report.model import FigureItem, Report, Section, Table
from vitscope.report.render import write_report

__all__ = ["featviz_sections", "write_featviz_report"]


def featviz_sections(out: Path, doc: Mapping[str, Any]) -> list[Section]:
    """Sections for the feature-visualisation results in ``doc["analyses"]`` (figures are files under ``out``)."""
    sections = []
    fv = doc["analyses"].get("featviz")
    if fv:
        sec = Section(id="featviz", title="Feature visualisation",
                      intro="Images optimised to maximise each unit (mean over spatial tokens of one channel) with "
                            "the published recipe of paper 001: 8 augmented copies, ColorShift, annealed noise, "
                            "circular jitter, total variation, Adam with a cosine schedule.")
        sec.figures.append(FigureItem(out / fv["grid_figure"], "Optimised images",
                                      "One image per unit; with --grid, one row per block (early blocks first).",
                                      "paper 001, figs. 1 and 7"))
        rows = [[name, u["activation"], u.get("best_dataset_score", ""), u["final_loss"]]
                for name, u in fv["units"].items()]
        sec.tables.append(Table("Units", ["unit", "activation of optimised image", "best dataset image",
                                          "final loss"], rows,
                                note="Activation = the unit's objective on the un-augmented optimised image."))
        for name, u in fv["units"].items():
            if "panel" in u:
                sec.figures.append(FigureItem(out / u["panel"], name,
                                              "Optimised image | most-activating dataset images | the unit's "
                                              "activation on their patches.", "paper 001, figs. 2 and 5"))
        sections.append(sec)
    tm = doc["analyses"].get("token_mixing")
    if tm and tm.get("num_images"):
        sec = Section(id="token-mixing", title="Last-layer token mixing",
                      intro="The classifier head applied to every token without fine-tuning, and CLS isolated from "
                            "the patches until block L (paper 001 section 4).")
        rows = [["model (CLS)", tm["model_accuracy"]], ["head on patch tokens, average", tm["patch_average"]],
                ["head on patch tokens, best patch", tm["patch_maximum"]]]
        rows += [[f"CLS inserted at block {L}", a] for L, a in tm["isolate_cls"].items()]
        sec.tables.append(Table("Accuracy", ["setting", "accuracy"], rows, note="paper 001, table 1"))
        for f in tm.get("figures", []):
            sec.figures.append(FigureItem(out / f, Path(f).stem.replace("_", " "), "", "paper 001, fig. 6"))
        sections.append(sec)
    si = doc["analyses"].get("spatial_information")
    if si:
        sec = Section(id="spatial-information", title="Spatial information in single channels",
                      intro="For random FFN channels of every block, a growing fraction of each unit's active "
                            "patches is blacked out in its most-activating images; the ratio of active patches "
                            "(count and sum) is plotted against that fraction (paper 001 appendix F).")
        sec.figures.append(FigureItem(out / si["figure"], "Ratio of active patches per block",
                                      "A line near 1 - x means the channel keeps spatial information; a flat "
                                      "line means it mixes tokens.", "paper 001, appendix F"))
        rows = [[f"block {b}", used, (lin or {}).get("r2", "")]
                for b, used, lin in zip(range(len(si["units_used"])), si["units_used"], si["linearity"])]
        sec.tables.append(Table("Units per block", ["block", "units with an active patch", "linearity"], rows))
        sections.append(sec)
    return sections


def write_featviz_report(out: Path, doc: Mapping[str, Any]) -> Path:
    """Write ``out/report.html``."""
    model = next(iter(doc["models"]))
    report = Report(title=f"vitscope featviz: {model}", subtitle="feature visualisation (paper 001)",
                    summary=[("model", model), ("version", doc["vitscope_version"]),
                             ("data", str(doc["data"].get("source", "none")))],
                    config=dict(doc["config"]), sections=featviz_sections(out, doc))
    return write_report(report, out / "report.html")
