"""Foreground/background reliance and Fourier filtering of several classifiers side by side (ViT beside CNN).

Paper 001 section 5 compares ViTs with CNNs; this runs :class:`~vitscope.analyses.masking.foreground.ForegroundMasking`
and :class:`~vitscope.analyses.masking.frequency.FrequencyFiltering` on every model (one pass each) and
draws one figure per measurement with every model in it. Any classifier backbone works (a ViT or a CNN with
a head); the data must give labels in the models' label space (and, for the foreground test, object masks, or
boxes with ``region="box"``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vitscope.analyses.result import Figure, Result
from vitscope.errors import VitscopeUsageError, VitscopeValueError
from vitscope.outputs.folder import check_output
from vitscope.outputs.lock import releasing_outputs

__all__ = ["run_robustness"]


class ModelsResult(Result):
    """One analysis run on several models: the summary per model, one figure with every model in it."""

    def __init__(self, name: str, per_model: dict[str, Result], figure: Figure | None) -> None:
        super().__init__(name, {}, {})
        self.per_model, self._figure = per_model, figure

    def to_json(self) -> dict[str, Any]:
        return {model: r.to_json() for model, r in self.per_model.items()}

    def tables(self) -> dict[str, Any]:
        return {f"{self.name}_{model.replace('/', '_')}": r.to_frame() for model, r in self.per_model.items()}

    def arrays(self) -> dict[str, Any]:
        return {}

    def figures(self) -> list[Figure]:
        return [self._figure] if self._figure is not None else []


@releasing_outputs
def run_robustness(models: Sequence[str], data: str, out: str | Path, batch_size: int = 32,
                   device: str | None = None, limit: int | None = None, region: str = "box", fill: str = "zero",
                   progress: bool | None = None, figure_files: bool = False, image_size: int | None = None,
                   log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the robustness analyses on every model; write ``results.json``, tables, combined figures, report.html.

    Args:
        models: model names (``vitscope.load_model``), at least one.
        data: dataset (``ROOT::coco``, ``ROOT::imagenet-boxes``, ...); foreground masking runs when it has masks,
            or boxes with ``region="box"``.
        out: output folder.
        batch_size, device, limit: as ``vitscope analyze``.
        region: foreground region, ``"box"`` or ``"mask"``.
        fill: how foreground masking fills the hidden pixels: ``"zero"`` (black, the default), ``"mean"`` (the
            dataset's mean: on the spurious world it separates a background shortcut that black boxes hide,
            docs/methods-masking.md) or ``"blur"``.
        progress: progress bars.
        figure_files: also write the figures as PNG and SVG (the report draws them in the browser).
        image_size: run every model at this input side (None: each model's own preprocessing).
        log: receives one-line messages (each model's input, foreground masking left out without its regions).

    Returns:
        The ``results.json`` document.
    """
    check_output(out)  # before any work: a wrong --out costs nothing
    from vitscope.analyses.data_checks import DataFacts
    from vitscope.analyses.masking.foreground import ForegroundMasking
    from vitscope.analyses.masking.frequency import FrequencyFiltering
    from vitscope.analyses.registry import not_run_text, why_skipped
    from vitscope.data.open import as_source
    from vitscope.engine.provenance import model_identity
    from vitscope.engine.results import run_record
    from vitscope.engine.run import PassTally, run
    from vitscope.engine.settings import describe_device, resolve_device
    from vitscope.functional.occlusion import FILLS
    from vitscope.models.input_size import describe_input
    from vitscope.models.load import load_model
    from vitscope.occlusion.regions import REGIONS
    from vitscope.outputs import RunResult, prepare_output, write_run
    from vitscope.viz.masking_charts import foreground_chart, frequency_chart

    if not models:
        raise VitscopeValueError("give at least one model (e.g. --models tiny-vit-sup,MY_CNN)")
    if region not in REGIONS:  # before anything loads or is written
        raise VitscopeUsageError(f"--region must be one of {', '.join(REGIONS)}, got {region!r}")
    if fill not in FILLS:
        raise VitscopeUsageError(f"--fill must be one of {', '.join(FILLS)}, got {fill!r}")
    resolve_device(device)  # an unknown or absent device: before any model loads
    source = as_source(data)
    # the analysis decides: region "box" takes boxes alone (ImageNet's) as well as masks
    facts = DataFacts(targets=source.target_keys())
    with_foreground = ForegroundMasking(region=region).why_unsupported_data(facts) is None
    per_model: dict[str, dict[str, Result]] = {}
    identities, described, not_run, seen = [], {}, {}, 0
    passes = PassTally()  # what the models' passes resumed and cost, together (results.json run)
    out = prepare_output(out)  # once the data opens: a refused run leaves no folder
    for name in models:
        backbone = load_model(name, image_size=image_size)
        identities.append(model_identity(name, backbone))
        if log:
            log(describe_input(backbone.spec))
        if not with_foreground and not not_run:
            not_run["foreground_masking"] = why_skipped(ForegroundMasking(region=region, fill=fill), backbone.spec,
                                                        source.target_keys()) or "the data has no object masks"
            if log:
                log(f"not run: {not_run_text(not_run)}")
        analyses = [FrequencyFiltering()]
        if with_foreground:
            analyses.insert(0, ForegroundMasking(region=region, fill=fill))
        results = run(backbone, source, analyses, batch_size=batch_size, device=device, limit=limit,
                      progress=progress)
        passes.add(results)
        per_model[name] = dict(results.items())
        described, seen = results.data, max(seen, results.num_images)
    results: dict[str, Result] = {}
    scored = {m: r["foreground_masking"] for m, r in per_model.items()
              if with_foreground and "normalised_accuracy" in r["foreground_masking"].tensors}
    if with_foreground and not scored:  # e.g. every box outside the centre crop: said, not a crash
        not_run["foreground_masking"] = next(iter(per_model.values()))["foreground_masking"].meta["error"]
        if log:
            log(f"not run: {not_run_text(not_run)}")
    if scored:
        fg = {m: r["normalised_accuracy"] for m, r in scored.items()}
        topk = next(iter(scored.values())).meta["topk"]  # the same k for every model

        def bars(path: Path) -> list[Path]:
            from vitscope.viz.masking_figures import foreground_bars_figure

            return foreground_bars_figure(fg, topk, path)

        results["foreground_masking"] = ModelsResult(
            "foreground_masking", {m: r["foreground_masking"] for m, r in per_model.items()},
            Figure("foreground_masking", bars, "Foreground masking", "Foreground-only (filled) and background-only "
                   "(hatched) accuracy of every model, normalised by its full-image accuracy (dashed at 1).",
                   "paper 001, tables 2 and 3", chart=foreground_chart(fg, topk)))
    freq = {m: r["frequency_filtering"] for m, r in per_model.items()}
    first = next(iter(freq.values()))

    accuracy = {m: r["accuracy"] for m, r in freq.items()}
    full = {m: float(r["full_accuracy"]) for m, r in freq.items()}

    def curves(path: Path) -> list[Path]:
        from vitscope.viz.masking_figures import frequency_figure

        return frequency_figure(accuracy, first.meta["fractions"], full, path)

    results["frequency_filtering"] = ModelsResult("frequency_filtering", freq, Figure(
        "frequency_filtering", curves, "Frequency filtering", "Accuracy of every model against the cut-off radius "
        "of low-pass (solid) and high-pass (dashed) filters; thin lines: unfiltered accuracy.", "paper 001, section 5",
        chart=frequency_chart(accuracy, first.meta["fractions"], full)))
    config = {"models": list(models), "data": data, "region": region, "fill": fill, "limit": limit,
              "image_size": image_size, "batch_size": batch_size, "device": device or "auto", "dtype": "fp32"}
    path = write_run(out, RunResult("experiment robustness", title=f"vitscope experiment robustness: "
                                    f"{', '.join(models)}", config=config, results=results, models=identities,
                                    data=described, num_images=seen, extra={"experiment": "robustness"},
                                    skipped_analyses=not_run, device=describe_device(device), **run_record(passes)),
                     progress=progress, figure_files=figure_files)
    return json.loads(path.read_text())
