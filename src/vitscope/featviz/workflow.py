"""The ``vitscope featviz`` workflow: optimise units, find their top dataset images, write outputs and report.

Written by the one writer: ``figures/featviz_<unit>.png`` (optimised images), ``figures/featviz_grid.png``
(figs. 1 and 7), ``tables/history.csv`` (loss and activation per step), with data ``figures/panel_<unit>.png``
(optimised | top images | maps, fig. 2) and the top-activations result; with ``token_mixing`` the table-1 numbers
and figure 6; ``results.json`` and ``report.html``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from vitscope.analyses.result import Figure, SummaryResult, png_path
from vitscope.errors import VitscopeKeyError, VitscopeUsageError, VitscopeValueError
from vitscope.featviz.augment import AugmentConfig
from vitscope.featviz.objectives import ChannelObjective, Objective, parse_objective
from vitscope.featviz.render import FeatvizConfig, FeatvizResult, StepInfo, evaluate, render
from vitscope.outputs.folder import check_output
from vitscope.outputs.lock import releasing_outputs

if TYPE_CHECKING:
    from vitscope.outputs import RunResult

__all__ = ["FeatvizOptions", "featviz_run", "grid_units", "run_featviz"]


@dataclass
class FeatvizOptions:
    """What the command line asks for (see ``vitscope featviz --help``)."""

    model: str
    out: Path
    units: list[str] = field(default_factory=list)
    grid: int = 0
    steps: int = 400
    seed: int = 0
    lambda_tv: float = 4e-4
    noise: str = "channel"
    color_shift: str = "code"
    data: str | None = None
    top_k: int = 5
    limit: int | None = None
    batch_size: int = 16
    token_mixing: bool = False
    spatial_information: int = 0
    device: str | None = None
    chunk: int = 16
    figure_files: bool = False
    image_size: int | None = None  # None: the model's own preprocessing


def grid_units(backbone, per_block: int, seed: int = 0) -> list[Objective]:
    """``per_block`` channels of every block (a transformer's FFN, a CNN's stage output), drawn with ``seed`` among
    the block's own channels (figs. 1 and 7: edges to objects)."""
    spec = backbone.spec
    gen = torch.Generator().manual_seed(seed)
    site = "blocks.{}.mlp.post" if spec.is_transformer else "stages.{}"
    if spec.is_transformer:
        widths = [spec.mlp_dim] * spec.num_blocks
    else:  # a CNN's stages widen as they go: each draws from its own width
        widths = _channels(backbone, [site.format(blk) for blk in range(spec.num_blocks)])
    units = []
    for blk, width in enumerate(widths):
        chans = torch.randperm(width, generator=gen)[:per_block].sort().values.tolist()
        units += [ChannelObjective(site.format(blk), c) for c in chans]
    return units


def _channels(backbone, sites: list[str]) -> list[int]:
    """Channels of each site (dimension 1 of a CNN map ``[B, C, h, w]``, the last of tokens ``[B, N, C]``), from
    one recorded forward of a blank image on the model's device."""
    device = next(backbone.parameters()).device
    with torch.no_grad(), backbone.record(sites) as rec:
        backbone(torch.zeros(1, 3, *backbone.spec.image_size, device=device))
    return [int(rec[s].shape[1] if rec[s].dim() == 4 else rec[s].shape[-1]) for s in sites]


def _check_units(backbone, objectives: list[Objective]) -> None:
    """Read every unit off one blank image, before the optimisation and before ``--out`` exists.

    Raises:
        VitscopeUsageError: a site the model lacks, a channel, token or class out of its range, a class logit of
            a model without a head: values only the model shows wrong are bad usage, as ``probe --blocks 99``.
    """
    if not objectives:
        return
    try:
        evaluate(backbone, objectives, torch.zeros(1, 3, *backbone.spec.image_size))
    except VitscopeUsageError:
        raise
    except (VitscopeKeyError, VitscopeValueError) as err:
        raise VitscopeUsageError(str(err)) from None


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "unit"


def _unique(objectives: list[Objective], log: Callable[[str], None]) -> list[Objective]:
    """The objectives without repeats, the first of each name kept in its place: a name is one image, one figure
    file and one entry of results.json, so a unit given twice (or given and drawn by ``--grid``) is optimised once."""
    kept: dict[str, Objective] = {}
    for objective in objectives:
        kept.setdefault(objective.name, objective)
    if len(kept) < len(objectives):
        repeated = [name for name in kept if sum(o.name == name for o in objectives) > 1]
        log(f"{', '.join(repeated)}: given more than once (or drawn by --grid as well); optimised once")
    return list(kept.values())


def _render_chunks(backbone, objectives: list[Objective], cfg: FeatvizConfig, chunk: int,
                   log: Callable[[str], None]) -> FeatvizResult:
    """Render in chunks of units (bounded memory); concatenate the results."""
    parts = []
    for start in range(0, len(objectives), chunk):
        group = objectives[start:start + chunk]
        every = max(1, cfg.steps // 4)

        def progress(info: StepInfo, start: int = start, group: list = group, every: int = every) -> None:
            if (info.step + 1) % every == 0:
                log(f"units {start}..{start + len(group) - 1}: step {info.step + 1}/{info.steps}, "
                    f"mean activation {float(info.activation.mean()):.3f}")

        parts.append(render(backbone, group, cfg, callback=progress))
    return FeatvizResult(sum((p.names for p in parts), []), torch.cat([p.images for p in parts]),
                         torch.cat([p.loss for p in parts], 1), torch.cat([p.activation for p in parts], 1), cfg)


def _seen_image(backbone, pil) -> torch.Tensor:
    """The image as the model saw it (resize, crop), ``[3, H, W]`` in [0, 1]."""
    x = backbone.preprocess([pil])[0]
    mean, std = torch.tensor(backbone.spec.mean).view(3, 1, 1), torch.tensor(backbone.spec.std).view(3, 1, 1)
    return (x * std + mean).clamp(0, 1)


def _top_images(backbone, dataset, objectives: list[Objective], options: FeatvizOptions, figures: list,
                result: FeatvizResult, log: Callable[[str], None]) -> tuple[dict[str, Any], Any]:
    """One streaming pass for the top-k images of every channel unit; a standard panel per unit (appended to
    ``figures``); returns the units' entries and the top-activations result."""
    from vitscope.analyses.activations.top import TopActivations
    from vitscope.engine.run import run
    from vitscope.viz.featviz_figures import panel_figure

    chans = [o for o in objectives if isinstance(o, ChannelObjective)]
    if not chans:
        return {}, None
    channels: dict[str, list[int]] = {}
    for o in chans:
        channels.setdefault(o.site, []).append(o.channel)
    channels = {site: sorted(set(ids)) for site, ids in sorted(channels.items())}
    acc = TopActivations(hooks=list(channels), k=options.top_k, channels=channels)
    res = run(backbone, dataset, [acc], batch_size=options.batch_size, device=options.device, limit=options.limit,
              progress=False)["top_activations"]
    entries: dict[str, Any] = {}
    for i, obj in enumerate(objectives):
        if not isinstance(obj, ChannelObjective) or obj.token is not None:
            continue
        j = res.meta["channels"][obj.site].index(obj.channel)
        scores = res[f"{obj.site}.scores"][j]
        indices = res[f"{obj.site}.indices"][j].tolist()
        images = [_seen_image(backbone, dataset.get(int(idx)).image) for idx in indices]

        files = [Path(res.meta["paths"][str(int(idx))]).name for idx in indices]

        def draw(path: Path, i: int = i, images: list = images, maps=res[f"{obj.site}.maps"][j], name=obj.name,
                 scores=scores.tolist(), files=files) -> list[Path]:
            return [panel_figure(result.images[i], images, maps, name, png_path(path), scores, files)]

        stem = f"panel_{_safe(obj.name).replace('.', '_')}"
        figures.append(Figure(stem, draw, obj.name, "The optimised image and the most-activating dataset images "
                              "(with the unit's mean activation), each image's patch activations under it, named by "
                              "its file.", "paper 001, figs. 2 and 5"))
        entries[obj.name] = {"panel": f"figures/{stem}.png", "best_dataset_score": float(scores[0]),
                             "top": [{"index": int(idx), "path": res.meta["paths"][str(int(idx))], "score": float(s)}
                                     for idx, s in zip(indices, scores.tolist())]}
    log(f"top {options.top_k} images of {len(entries)} units from {res.meta['num_images']} images")
    return entries, res


def _token_mixing(backbone, dataset, options: FeatvizOptions) -> Any:
    from vitscope.experiments.token_mixing import token_mixing

    return token_mixing(backbone, dataset, batch_size=options.batch_size, limit=options.limit, device=options.device)


def _spatial_information(backbone, dataset, options: FeatvizOptions) -> Any:
    """Appendix F on ``options.spatial_information`` seeded random FFN channels of every block."""
    from vitscope.engine.run import run
    from vitscope.featviz.spatial import PreprocessedImages, spatial_information_by_block
    from vitscope.viz.featviz_charts import spatial_information_chart
    from vitscope.viz.featviz_figures import spatial_information_figure

    limit = options.limit or 300  # candidates for each unit's top images; every one is re-run per fraction
    seen = run(backbone, dataset, [PreprocessedImages()], batch_size=options.batch_size, device=options.device,
               limit=limit, progress=False)[PreprocessedImages.name]
    images = _unnormalise(backbone, seen["pixels"])
    gen = torch.Generator().manual_seed(options.seed)
    (width,) = _channels(backbone, ["blocks.0.mlp.post"])
    channels = torch.randperm(width, generator=gen)[: options.spatial_information].tolist()
    res = spatial_information_by_block(backbone, images, channels, k=options.top_k, seed=options.seed)
    labels = [f"block {b}" for b in res["blocks"]]

    def draw(path: Path) -> list[Path]:
        return [spatial_information_figure(res["fractions"], res["count_ratio"], res["sum_ratio"], labels,
                                           png_path(path))]

    summary = {"channels": channels, "images": len(images), "fractions": res["fractions"].tolist(),
               "count_ratio": res["count_ratio"].tolist(), "sum_ratio": res["sum_ratio"].tolist(),
               "units_used": res["units_used"].tolist(), "linearity": res["linearity"]}
    return SummaryResult("spatial_information", summary, figures=[Figure(
        "spatial_information", draw, "Ratio of active patches per block", "A line near 1 - x means the channel "
        "keeps spatial information; a flat line means it mixes tokens.", "paper 001, appendix F",
        chart=spatial_information_chart(res["fractions"], res["count_ratio"], res["sum_ratio"], labels))])


def _unnormalise(backbone, pixels: torch.Tensor) -> torch.Tensor:
    """Model-normalised pixels ``[B, 3, H, W]`` back to [0, 1] (the spatial test blacks out patches there)."""
    mean = torch.tensor(backbone.spec.mean).view(1, 3, 1, 1)
    std = torch.tensor(backbone.spec.std).view(1, 3, 1, 1)
    return (pixels.cpu() * std + mean).clamp(0, 1)


@releasing_outputs
def run_featviz(options: FeatvizOptions, log: Callable[[str], None] = lambda s: None) -> Path:
    """Run the command; return the path of ``results.json``."""
    check_output(options.out)  # before any work: a wrong --out costs nothing
    from vitscope.outputs import prepare_output, write_run

    # --out is made once the units are read off the model (a bad unit leaves no folder), before the optimisation
    # (an unusable folder fails before the work)
    folder: list[Path] = []
    run = featviz_run(options, log, ready=lambda: folder.append(prepare_output(options.out)))
    return write_run(folder[0], run, figure_files=options.figure_files)


def featviz_run(options: FeatvizOptions, log: Callable[[str], None] = lambda s: None,
                ready: Callable[[], None] | None = None) -> RunResult:
    """What ``vitscope featviz`` writes (``options.out`` is not touched): the ``featviz`` result (optimised images,
    with data the top-image panels and ``top_activations``), optionally ``token_mixing`` and
    ``spatial_information``, their report sections and notes. The demo shows it in its own report.

    ``ready`` is called once the options and units are checked against the model, before the optimisation.

    Raises:
        VitscopeUsageError: no unit, a unit that cannot be read, or one the model does not have.
    """
    from vitscope.engine.provenance import model_identity
    from vitscope.engine.run import resolve_device
    from vitscope.featviz.report_section import featviz_sections
    from vitscope.models.input_size import describe_input
    from vitscope.models.load import load_model
    from vitscope.outputs import RunResult
    from vitscope.viz.featviz_figures import unit_grid_figure

    if not options.units and options.grid <= 0:
        raise VitscopeUsageError("give at least one --unit (e.g. blocks.5.mlp.post:31) or --grid N")
    objectives = [parse_objective(u) for u in options.units]
    cfg = FeatvizConfig(steps=options.steps, seed=options.seed, lambda_tv=options.lambda_tv,
                        augment=AugmentConfig(noise=options.noise, color_shift=options.color_shift))
    device = resolve_device(options.device)  # an unknown or absent device: before the model loads
    backbone = load_model(options.model, image_size=options.image_size)
    if options.spatial_information and not backbone.spec.is_transformer:  # before the optimisation, not after
        raise VitscopeValueError(f"--spatial-information measures transformer FFN channels; {backbone.spec.name} is "
                                 "a CNN")
    log(describe_input(backbone.spec))
    backbone.to(device).eval()
    _check_units(backbone, objectives)
    if options.grid > 0:
        drawn = grid_units(backbone, options.grid, options.seed)
        if len(drawn) < options.grid * backbone.spec.num_blocks:
            log(f"--grid {options.grid}: capped at the channels of each block ({len(drawn)} units in all)")
        objectives += drawn
    objectives = _unique(objectives, log)
    if ready is not None:
        ready()
    log(f"optimising {len(objectives)} unit{'' if len(objectives) == 1 else 's'} for {cfg.steps} steps on {device}")
    result = _render_chunks(backbone, objectives, cfg, options.chunk, log)
    clean = evaluate(backbone, objectives, result.images).reshape(-1, len(objectives)).diagonal()

    figures: list[Figure] = []
    per_block = options.grid if options.grid > 0 and not options.units else None

    def grid(path: Path) -> list[Path]:
        return [unit_grid_figure(result.images, result.names, png_path(path), columns=per_block,
                                 title=f"{backbone.spec.name}: optimised images")]

    figures.append(Figure("featviz_grid", grid, "Optimised images", "One image per unit; with --grid, one row per "
                          "block (early blocks first).", "paper 001, figs. 1 and 7"))
    units: dict[str, dict[str, Any]] = {}
    for i, (name, img) in enumerate(zip(result.names, result.to_uint8())):
        stem = f"featviz_{_safe(name).replace('.', '_')}"

        def image(path: Path, img=img) -> list[Path]:
            from PIL import Image

            Image.fromarray(img.numpy()).save(png_path(path))
            return [png_path(path)]

        figures.append(Figure(stem, image, name, "The optimised image of this unit.", "paper 001, fig. 1"))
        units[name] = {"image": f"figures/{stem}.png", "final_loss": float(result.loss[-1, i]),
                       "activation": float(clean[i])}
    results: dict[str, Any] = {}
    data_doc: dict[str, Any] = {}
    if options.data:
        from vitscope.data.open import as_source

        dataset = as_source(options.data)
        data_doc = {**dataset.describe(), "fingerprint": dataset.fingerprint()}
        top, top_result = _top_images(backbone, dataset, objectives, options, figures, result, log)
        for name, entry in top.items():
            units[name].update(entry)
            units[name]["below_dataset_best"] = units[name]["activation"] < entry["best_dataset_score"]
        if top_result is not None:
            results["top_activations"] = top_result
        if options.token_mixing:
            results["token_mixing"] = _token_mixing(backbone, dataset, options)
        if options.spatial_information:
            results["spatial_information"] = _spatial_information(backbone, dataset, options)
    elif options.token_mixing or options.spatial_information:
        raise VitscopeValueError("--token-mixing and --spatial-information need --data (e.g. --data ROOT::imagefolder)")
    notes = _weak_units(units)
    featviz = SummaryResult("featviz", {"units": units, "grid_figure": "figures/featviz_grid.png",
                                       "recipe": _jsonable(cfg.to_dict())},
                            tables={"history": _history(result)}, figures=figures)
    results = {"featviz": featviz, **results}
    config = {"command": "featviz", "model": options.model, "units": [o.name for o in objectives],
              "device": str(device), **_jsonable(cfg.to_dict()), "top_k": options.top_k, "limit": options.limit,
              "image_size": options.image_size}
    return RunResult("featviz", title=f"vitscope featviz: {options.model}",
                     subtitle="feature visualisation (paper 001)", config=config, results=results,
                     models=[model_identity(options.model, backbone)], data=data_doc,
                     sections=featviz_sections(results),
                     own_sections={"featviz", "token_mixing", "spatial_information"}, notes=notes)


class WeakFeatureVisualisationWarning(UserWarning):
    """An optimised image activates its unit less than the best dataset image does: the optimisation failed."""


def _weak_units(units: dict[str, dict[str, Any]]) -> list[str]:
    """One warning (and report note) per unit whose optimised image ends below its best dataset image."""
    import warnings

    notes = []
    for name, unit in units.items():
        if unit.get("below_dataset_best"):
            notes.append(f"{name}: the optimised image reaches {unit['activation']:.3g}, below the best dataset "
                         f"image ({unit['best_dataset_score']:.3g}); the visualisation did not find what the unit "
                         "responds to (try more --steps, a smaller --lambda-tv or --color-shift none)")
            warnings.warn(WeakFeatureVisualisationWarning(notes[-1]), stacklevel=3)
    return notes


def _jsonable(d: dict) -> dict:
    return json.loads(json.dumps(d, default=list))


def _history(result: FeatvizResult):
    """Loss and activation of every unit at every step, as a table."""
    import pandas as pd

    rows = [[step, name, float(result.loss[step, u]), float(result.activation[step, u])]
            for step in range(result.loss.shape[0]) for u, name in enumerate(result.names)]
    return pd.DataFrame(rows, columns=["step", "unit", "loss", "activation"])
