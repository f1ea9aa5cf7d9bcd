"""The report sections of ``vitscope featviz``, built from its results (figures named by their stems)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from vitscope.report.model import Section, Table

__all__ = ["featviz_sections", "recipe_text"]


def recipe_text(recipe: Mapping[str, Any] | None) -> str:
    """One sentence on the optimisation a run used (``FeatvizConfig.to_dict()``); None: the published defaults."""
    from vitscope.featviz.render import FeatvizConfig

    published = json.loads(json.dumps(FeatvizConfig().to_dict(), default=list))  # as results.json holds it
    cfg = published if recipe is None else recipe
    a = cfg["augment"]
    parts = [f"{a['copies']} augmented {'copy' if a['copies'] == 1 else 'copies'} per step"]
    if a["color_shift"] != "none":
        parts.append(f"ColorShift ({a['color_shift']} form)")
    if a["noise"] != "none" and a["noise_std"] > 0:
        parts.append(f"{a['noise']} noise annealed from {a['noise_std']:g}")
    if a["jitter"] > 0:
        parts.append(f"circular jitter up to {a['jitter']:g} px at 224 px ({a['jitter_mode']})")
    if cfg["lambda_tv"] > 0:
        parts.append(f"total variation (weight {cfg['lambda_tv']:g})")
    steps = f"{cfg['steps']} step{'' if cfg['steps'] == 1 else 's'}"
    parts.append(f"{steps} of Adam (lr {cfg['lr']:g}, {cfg['schedule']} schedule)")
    def recipe(c: Mapping[str, Any]) -> dict[str, Any]:  # the number of steps and the seed are no recipe
        return {k: v for k, v in c.items() if k not in ("steps", "seed")}

    same = recipe(cfg) == recipe(published)
    off = [name for name, gone in (("ColorShift", a["color_shift"] == "none"), ("noise", a["noise"] == "none"),
                                   ("total variation", cfg["lambda_tv"] <= 0)) if gone]
    head = ("the published recipe of paper 001: " if same else
            "paper 001's recipe changed" + (f" ({', '.join(off)} off)" if off else "") + ": ")
    return head + ", ".join(parts) + "."


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
            intro="Images optimised to maximise each unit (a channel averaged over spatial tokens, or at one token "
                  "when the unit names it with @; a class logit for logit:K) with "
                  + recipe_text(fv.meta.get("recipe")),
            figures=figures,
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
