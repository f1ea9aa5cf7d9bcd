"""``vitscope explanations``: every attribution method on every model scored against ground truth (object masks,
labels, background types), each number beside its control (:mod:`vitscope.explain.benchmark`), written like
every command's outputs."""

from __future__ import annotations

import functools
import json
import math
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vitscope.analyses.result import Figure, SummaryResult
from vitscope.outputs.folder import check_output
from vitscope.outputs.lock import releasing_outputs

__all__ = ["run_explanations"]


def _stem(model_id: str) -> str:
    """A model's id as part of a file name (a folder or hub id has slashes)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", model_id).strip("_.") or "model"


def _each_once(models: Sequence[str]) -> list[str]:
    """The models, refused before anything is scored or written when two would write the same files."""
    from vitscope.errors import VitscopeUsageError

    models, stems = list(models), [_stem(m) for m in models]
    for i, stem in enumerate(stems):
        if stem in stems[:i]:
            first = models[stems.index(stem)]
            if first == models[i]:
                raise VitscopeUsageError(f"model {first!r} is listed twice in --models; list each model once")
            raise VitscopeUsageError(f"models {first!r} and {models[i]!r} would share file names ({stem!r}); "
                                     "give one of them another path")
    return models


def _grid(draw: Callable, shown: list, maps: dict, names: list, title: str, path: Path) -> list[Path]:
    return draw(shown, maps, names, title, path)


def _curves_figure(name: str, curves: dict[str, dict[str, Any]], steps: int, num_patches: int) -> Figure | None:
    from vitscope.functional.faithfulness import step_fractions
    from vitscope.viz.charts import block_lines_chart, curve

    if not curves:
        return None
    fractions = [f"{f:.3f}" for f in step_fractions(num_patches, steps).tolist()]  # the share each step removed
    series = [curve(f"{method} {kind.replace('_', ', ')}", values, method, "dashed" if "road" in kind else "line")
              for method, kinds in curves.items() for kind, values in kinds.items() if kind.startswith("deletion")]
    chart = block_lines_chart(series, "score", steps + 1, fractions, f"{name}: deletion curves (dashed: ROAD fill)",
                              x_label="share of patches removed")

    def draw(path: Path) -> list[Path]:
        from vitscope.viz.attention_figures import block_lines_figure

        return block_lines_figure({s.name: (s.values, None) for s in series}, f"{name}: deletion curves", "score",
                                  path, block_labels=fractions)

    return Figure(f"deletion_{_stem(name)}", draw, f"{name}: deletion curves", "The model's score as the most relevant "
                  "patches go first, per method (solid: mean-colour fill, dashed: ROAD's imputation); a faithful "
                  "map falls fast.", "Rong et al. 2022 (ROAD)", chart=chart)


def _planned(models: Sequence[str], methods: Sequence[str] | None, steps: int | None,
             log: Callable[[str], None] | None, check: Callable[[Any, str], None] | None = None
             ) -> tuple[dict[str, list[str]], dict[str, str], dict[str, Any]]:
    """The methods each model runs and those left out (``method@model`` -> why), decided before anything is scored,
    so that a run that cannot finish stops before the slow part, not after the models before the one that fails.

    The models are loaded in reverse order and only the first is kept (returned, by name, to be scored first), so
    one model is in memory at a time and the first (with one model, the only one) is not loaded twice. Every model's
    input and the methods it leaves out go to ``log``, in the order of ``models``.

    Args:
        models: model names or folders.
        methods: the methods asked for, or None / ``["all"]``.
        steps: points of the deletion and insertion curves (at most one a patch), or None (no curves).
        log: one-line messages.
        check: ``(backbone, name)``, raising for a model the benchmark cannot score.

    Raises:
        VitscopeUsageError: ``steps`` above the number of patches of a model that runs a method, or no method that
            runs on any model.
    """
    from vitscope.analyses.registry import not_run_text
    from vitscope.errors import VitscopeUsageError
    from vitscope.explain.benchmark import methods_for
    from vitscope.models.input_size import describe_input
    from vitscope.models.load import load_model

    chosen: dict[str, list[str]] = {}
    not_runs: dict[str, dict[str, str]] = {}
    patches: dict[str, int] = {}
    lines: dict[str, str] = {}
    kept: dict[str, Any] = {}
    for model_id in reversed(models):
        kept.clear()  # the model loaded before this one: one in memory at a time
        backbone = load_model(model_id)
        if check is not None:
            check(backbone, model_id)
        chosen[model_id], not_runs[model_id] = methods_for(backbone, methods)
        lines[model_id] = describe_input(backbone.spec) + (
            f"; not run: {not_run_text(not_runs[model_id])}" if not_runs[model_id] else "")
        patches[model_id] = math.prod(backbone.spec.grid)
        kept[model_id] = backbone
        del backbone
    skipped = {f"{m}@{model_id}": why for model_id in models for m, why in not_runs[model_id].items()}
    for model_id in models if log else ():
        log(lines[model_id])
    if not any(chosen.values()):
        raise VitscopeUsageError(f"--methods: no method asked for runs on {', '.join(models)}, so nothing would be "
                                 f"scored: {'; '.join(f'{k} ({why})' for k, why in skipped.items())}; give methods "
                                 "that fit the models, or all")
    few = {m: k for m, k in patches.items() if chosen[m] and steps is not None and steps > k}
    if few:
        raise VitscopeUsageError(f"--steps {steps} is more than the patches of "
                                 f"{', '.join(f'{m} ({k})' for m, k in few.items())}: each point of the deletion and "
                                 f"insertion curves removes at least one patch; give --steps {min(few.values())} "
                                 "or fewer")
    return chosen, skipped, kept


@releasing_outputs
def run_explanations(models: Sequence[str], data: str, out: str | os.PathLike, methods: Sequence[str] | None = None,
                     limit: int = 32, steps: int | None = None, sanity: bool | None = None,
                     log: Callable[[str], None] | None = None, batch_size: int = 16) -> dict[str, Any]:
    """Score ``methods`` (default: every one a model can give) on ``models`` over ``data`` and write the run.

    Args:
        models: model names or folders.
        data: a dataset with object masks and labels (``ROOT::coco``; the synthetic world also gives each image's
            background type, for the shortcut score).
        out: the output folder.
        methods: attribution methods, or None / ``["all"]``.
        limit: images scored (the first with objects and labels).
        steps: points of the deletion and insertion curves (None: 8).
        sanity: run the cascading randomisation check (transformers; None: yes). The segmentation benchmark
            (a ``.mat`` file) runs neither: it refuses both.
        log: one-line progress messages (each model's input first: size, token grid, preprocessing, the methods
            it leaves out).
        batch_size: images explained at a time (memory, not numbers).

    Returns:
        The ``results.json`` document; ``skipped_analyses`` holds the methods left out (``method@model``).

    Raises:
        VitscopeUsageError: no model, ``steps`` above a model's number of patches, no method asked for that runs
            on any model, or ``steps`` or ``sanity`` given with a ``.mat`` file; all before anything is scored.
    """
    check_output(out)  # before any work: a wrong --out costs nothing
    import pandas as pd

    from vitscope.data.open import as_source
    from vitscope.engine.decoding import data_entry
    from vitscope.engine.provenance import model_identity
    from vitscope.errors import VitscopeUsageError
    from vitscope.explain.benchmark import benchmark_model, method_parameters, prepared, shortcut_rows
    from vitscope.models.load import load_model
    from vitscope.outputs import RunResult, prepare_output, write_run
    from vitscope.viz.attribution_figures import attribution_grid

    if not models:
        raise VitscopeUsageError("--models names no model; give one or more, separated by commas")
    models, methods = _each_once(models), None if methods is None else list(dict.fromkeys(methods))
    if str(data).endswith(".mat"):  # the ImageNet segmentation benchmark file
        if steps is not None or sanity is not None:
            raise VitscopeUsageError("--steps and --sanity set the faithfulness curves and the randomisation check, "
                                     "which the ImageNet segmentation benchmark (.mat) does not run; leave them out")
        return _segmentation(models, Path(str(data)), out, methods, limit, log, batch_size)
    steps, sanity = 8 if steps is None else steps, True if sanity is None else sanity
    source = as_source(data)
    root = Path(str(data).split("::", 1)[0])
    settings = root / "synth.json"
    backgrounds = len(json.loads(settings.read_text()).get("backgrounds", [])) if settings.is_file() else None
    plan, skipped, kept = _planned(models, methods, steps, log)
    folder = None  # made once the first model's images are known good: a refused run leaves no folder
    rows, identities, figures = [], [], []
    scored = 0
    for model_id in models:
        backbone = kept.pop(model_id, None)
        if not plan[model_id]:  # nothing to score on it (skipped_analyses says why)
            continue
        backbone = backbone if backbone is not None else load_model(model_id)
        bench = prepared(backbone, source, limit, backgrounds)
        folder = folder or prepare_output(out)
        scored = len(bench.shown)  # the images the benchmark scores (no more than the data holds)
        model_rows, maps, curves = benchmark_model(backbone, model_id, bench, plan[model_id], steps=steps,
                                                   sanity=sanity, say=log, batch_size=batch_size)
        rows += model_rows
        identities.append(model_identity(model_id, backbone))
        shown, names = bench.shown[:4], [f"image {i}" for i in range(min(4, len(bench.shown)))]
        draw = functools.partial(_grid, attribution_grid, shown, {m: t[:4] for m, t in maps.items()}, names,
                                 f"{model_id}: every method on the first images")
        figures.append(Figure(f"maps_{_stem(model_id)}", draw, f"{model_id}: example maps",
                              "Each method's map over the first images (colours per map for display; the scores use "
                              "the raw maps).",
                              "Chefer et al. 2021"))
        curve_figure = _curves_figure(model_id, curves, steps, math.prod(backbone.spec.grid))
        if curve_figure is not None:
            figures.append(curve_figure)
    rows += shortcut_rows(rows)
    table = pd.DataFrame([{"model": r.model, "method": r.method, "family": r.family, "metric": r.metric,
                           "value": r.value, **{f"control_{k}": v for k, v in r.controls.items()}, "note": r.note}
                          for r in rows])
    scored_methods = sorted({r.method for r in rows})
    params = method_parameters(scored_methods, sanity=any(r.family == "sanity" for r in rows))
    summary = {"models": list(models), "methods": scored_methods, "images": scored, "steps": steps,
               "method_params": params, "rows": json.loads(table.to_json(orient="records")), "not_run": skipped}
    result = SummaryResult("explanations", summary, tables={"explanations": table}, figures=figures,
                           intro="Every attribution method scored against ground truth: localisation, faithfulness "
                                 "(mean fill and ROAD), sanity and the background shortcut, each beside its control.")
    path = write_run(folder or out, RunResult(
        "explanations", title=f"vitscope explanations: {', '.join(models)}",
        config={"command": "explanations", "models": list(models), "data": str(data),
                "methods": list(methods or ["all"]), "limit": limit, "steps": steps, "sanity": sanity,
                "batch_size": batch_size},
        results={"explanations": result}, models=identities, data=data_entry(source), num_images=scored,
        skipped_analyses=skipped))
    return json.loads(Path(path).read_text())


def _segmentation(models: Sequence[str], path: Path, out: Path, methods: Sequence[str] | None, limit: int,
                  log: Callable[[str], None] | None, batch_size: int) -> dict[str, Any]:
    """``vitscope explanations --data gtsegs_ijcv.mat``: every method scored by the segmentation benchmark."""
    import pandas as pd

    from vitscope.data.formats.imagenet_seg import ImagenetSegmentation
    from vitscope.engine.provenance import model_identity
    from vitscope.explain.benchmark import method_parameters
    from vitscope.explain.segmentation_benchmark import require_classifier, segmentation_benchmark
    from vitscope.models.load import load_model
    from vitscope.outputs import RunResult, prepare_output, write_run

    data = ImagenetSegmentation(path)
    plan, skipped, kept = _planned(models, methods, None, log, check=require_classifier)
    out = prepare_output(out)  # once the data opens and every model can be scored: a refused run leaves no folder
    rows, identities = [], []
    for model_id in models:
        backbone = kept.pop(model_id, None)
        if not plan[model_id]:  # nothing to score on it (skipped_analyses says why)
            continue
        backbone = backbone if backbone is not None else load_model(model_id)
        rows += segmentation_benchmark(backbone, model_id, data, plan[model_id], limit=limit, say=log,
                                       batch_size=batch_size)
        identities.append(model_identity(model_id, backbone))
    table = pd.DataFrame([{"model": r.model, "method": r.method, "metric": r.metric, "value": r.value}
                          for r in rows])
    scored_methods = sorted({r.method for r in rows})
    summary = {"models": list(models), "methods": scored_methods, "images": min(limit, len(data)),
               "benchmark": "ImageNet segmentation (gtsegs_ijcv.mat)",
               "method_params": method_parameters(scored_methods, faithful=False, sanity=False),
               "rows": json.loads(table.to_json(orient="records")), "not_run": skipped}
    result = SummaryResult("explanations", summary, tables={"explanations": table},
                           intro="Every attribution method scored by the ImageNet segmentation benchmark: pixel "
                                 "accuracy, mean IoU and mean average precision of the map against the object.")
    written = write_run(out, RunResult(
        "explanations", title=f"vitscope explanations: {', '.join(models)} on {path.name}",
        config={"command": "explanations", "models": list(models), "data": str(path),
                "methods": list(methods or ["all"]), "limit": limit, "batch_size": batch_size},
        results={"explanations": result}, models=identities,
        data={"name": path.name, "source": str(path.resolve()), "format": "imagenet-segmentation",
              "num_files": len(data), "label_rule": "each image's predicted class is explained (no label is read)"},
        num_images=summary["images"],
        skipped_analyses=skipped))
    return json.loads(Path(written).read_text())
