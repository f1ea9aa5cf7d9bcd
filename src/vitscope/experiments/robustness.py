"""Foreground/background reliance and Fourier filtering of several classifiers side by side (ViT beside CNN).

Paper 001 section 5 compares ViTs with CNNs; this runs :class:`~vitscope.analyses.masking_foreground.ForegroundMasking`
and :class:`~vitscope.analyses.masking_frequency.FrequencyFiltering` on every model (one pass each) and
draws one figure per measurement with every model in it. Any classifier backbone works (a ViT or a CNN with
a head); the data must give labels in the models' label space (and object masks for the foreground test).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["run_robustness"]


def run_robustness(models: Sequence[str], data: str, out: str | Path, batch_size: int = 32,
                   device: str | None = None, limit: int | None = None, region: str = "box",
                   progress: bool | None = None) -> dict[str, Any]:
    """Run the robustness analyses on every model; write ``results.json``, tables, combined figures, report.html.

    Args:
        models: model names (``vitscope.load_model``), at least one.
        data: dataset (``ROOT::coco``, ``ROOT::imagenet-boxes``, ...); foreground masking runs when it has masks.
        out: output folder.
        batch_size, device, limit: as ``vitscope analyze``.
        region: foreground region, ``"box"`` or ``"mask"``.
        progress: progress bars.

    Returns:
        The ``results.json`` document.
    """
    import vitscope
    from vitscope.analyses.masking_foreground import ForegroundMasking
    from vitscope.analyses.masking_frequency import FrequencyFiltering
    from vitscope.cli.analyze import dataset_targets, describe_data
    from vitscope.data.open import open_dataset
    from vitscope.engine.provenance import model_identity
    from vitscope.engine.run import run
    from vitscope.models.load import load_model
    from vitscope.report import analyze_report, write_report
    from vitscope.viz.masking_figures import foreground_bars_figure, frequency_figure

    if not models:
        raise ValueError("give at least one model (e.g. --models tiny-vit-sup,MY_CNN)")
    out = Path(out)
    dataset = open_dataset(data)
    with_masks = "masks" in dataset_targets(dataset)
    per_model: dict[str, dict[str, Any]] = {}
    identities = []
    for name in models:
        backbone = load_model(name)
        identities.append(model_identity(name, backbone))
        analyses = [FrequencyFiltering()]
        if with_masks:
            analyses.insert(0, ForegroundMasking(region=region))
        results = run(backbone, dataset, analyses, batch_size=batch_size, device=device, limit=limit,
                      progress=progress)
        per_model[name] = dict(results.items())
        for result in results.values():
            result.save(out / "tables" / name.replace("/", "_"))
    figures: dict[str, list[Path]] = {}
    if with_masks:
        figures["foreground_masking"] = foreground_bars_figure(
            {m: r["foreground_masking"]["normalised_accuracy"] for m, r in per_model.items()}, [1, 5],
            out / "figures" / "foreground_masking")
    freq = {m: r["frequency_filtering"] for m, r in per_model.items()}
    first = next(iter(freq.values()))
    figures["frequency_filtering"] = frequency_figure(
        {m: r["accuracy"] for m, r in freq.items()}, first.meta["fractions"],
        {m: float(r["full_accuracy"]) for m, r in freq.items()}, out / "figures" / "frequency_filtering")
    doc = {"vitscope_version": vitscope.__version__, "experiment": "robustness",
           "config": {"models": list(models), "data": data, "region": region, "limit": limit},
           "models": identities, "data": describe_data(dataset),
           "analyses": {name: {"summary": {m: res[name].summary() for m, res in per_model.items()},
                               "files": {"tables": [], "figures": [str(p.relative_to(out)) for p in paths]}}
                        for name, paths in figures.items()}}
    (out / "results.json").write_text(json.dumps(doc, indent=1, default=str))
    write_report(analyze_report(out, doc), out / "report.html")
    return doc
