"""The ``vitscope featviz`` workflow: optimise units, find their top dataset images, write outputs and report.

Outputs in ``out``: ``images/<unit>.png`` (optimised images), ``featviz_grid.png`` (figs. 1 and 7),
``history.csv`` (loss and activation per step), with data ``panels/<unit>.png`` (optimised | top images |
maps, fig. 2) and ``top_activations.*``; with ``token_mixing`` the table-1 numbers and figure 6;
``results.json`` and ``report.html``.
"""

from __future__ import annotations

import json
import platform
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import vitscope
from vitscope.featviz.augment import AugmentConfig
from vitscope.featviz.objectives import ChannelObjective, Objective, parse_objective
from vitscope.featviz.render import FeatvizConfig, FeatvizResult, StepInfo, evaluate, render

__all__ = ["FeatvizOptions", "grid_units", "run_featviz"]


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


def grid_units(spec, per_block: int, seed: int = 0) -> list[Objective]:
    """``per_block`` FFN channels of every block, drawn with ``seed`` (figs. 1 and 7: edges to objects)."""
    gen = torch.Generator().manual_seed(seed)
    if spec.is_transformer:
        width, site = spec.mlp_dim, "blocks.{}.mlp.post"
    else:
        width, site = spec.embed_dim, "stages.{}"  # the last map's width bounds every stage's channels only loosely
        width = min(width, 64)
    units = []
    for blk in range(spec.num_blocks):
        chans = torch.randperm(width, generator=gen)[:per_block].sort().values.tolist()
        units += [ChannelObjective(site.format(blk), c) for c in chans]
    return units


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "unit"


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


def _top_images(backbone, dataset, objectives: list[Objective], options: FeatvizOptions, out: Path,
                result: FeatvizResult, log: Callable[[str], None]) -> dict[str, Any]:
    """One streaming pass for the top-k images of every channel unit; standard panels per unit."""
    from vitscope.analyses.top_activations import TopActivations
    from vitscope.engine.run import run
    from vitscope.viz.featviz_figures import panel_figure

    chans = [o for o in objectives if isinstance(o, ChannelObjective)]
    if not chans:
        return {}
    channels: dict[str, list[int]] = {}
    for o in chans:
        channels.setdefault(o.site, []).append(o.channel)
    channels = {site: sorted(set(ids)) for site, ids in sorted(channels.items())}
    acc = TopActivations(hooks=list(channels), k=options.top_k, channels=channels)
    res = run(backbone, dataset, [acc], batch_size=options.batch_size, device=options.device, limit=options.limit,
              progress=False)["top_activations"]
    res.save(out)
    entries: dict[str, Any] = {}
    for i, obj in enumerate(objectives):
        if not isinstance(obj, ChannelObjective) or obj.token is not None:
            continue
        j = res.meta["channels"][obj.site].index(obj.channel)
        scores = res[f"{obj.site}.scores"][j]
        indices = res[f"{obj.site}.indices"][j].tolist()
        images = [_seen_image(backbone, dataset.get(int(idx)).image) for idx in indices]
        panel = panel_figure(result.images[i], images, res[f"{obj.site}.maps"][j], obj.name,
                             out / "panels" / f"{_safe(obj.name)}.png", scores.tolist())
        entries[obj.name] = {"panel": str(panel.relative_to(out)), "best_dataset_score": float(scores[0]),
                             "top": [{"index": int(idx), "path": res.meta["paths"][str(int(idx))], "score": float(s)}
                                     for idx, s in zip(indices, scores.tolist())]}
    log(f"top {options.top_k} images of {len(entries)} units from {res.meta['num_images']} images")
    return entries


def _token_mixing(backbone, dataset, options: FeatvizOptions, out: Path) -> dict[str, Any]:
    from vitscope.engine.batches import iter_batches
    from vitscope.experiments.token_mixing import token_mixing

    def batches():
        for _, loaded in iter_batches(dataset, options.batch_size, options.limit, preprocess=backbone.preprocess):
            if loaded is None:
                continue
            labels = loaded.targets.get("label")
            if labels is None:
                raise ValueError("--token-mixing needs labelled data: give --data ROOT::imagefolder (or another "
                                 "format with labels)")
            yield loaded.pixels, torch.as_tensor([int(v) for v in labels])

    res = token_mixing(backbone, batches(), device=options.device)
    res.save(out)
    figures = res.plot(out / "figures")
    return {**res.summary(), "figures": [str(p.relative_to(out)) for p in figures]}


def _spatial_information(backbone, dataset, options: FeatvizOptions, out: Path) -> dict[str, Any]:
    """Appendix F on ``options.spatial_information`` seeded random FFN channels of every block."""
    from vitscope.engine.batches import iter_batches
    from vitscope.featviz.spatial import spatial_information_by_block
    from vitscope.viz.featviz_figures import spatial_information_figure

    limit = options.limit or 300  # candidates for each unit's top images; every one is re-run per fraction
    loaded = iter_batches(dataset, options.batch_size, limit, preprocess=backbone.preprocess)
    pixels = [batch.pixels for _, batch in loaded if batch]
    images = _unnormalise(backbone, torch.cat(pixels))
    gen = torch.Generator().manual_seed(options.seed)
    channels = torch.randperm(_mlp_width(backbone), generator=gen)[: options.spatial_information].tolist()
    res = spatial_information_by_block(backbone, images, channels, k=options.top_k, seed=options.seed)
    labels = [f"block {b}" for b in res["blocks"]]
    fig = spatial_information_figure(res["fractions"], res["count_ratio"], res["sum_ratio"], labels,
                                     out / "figures" / "spatial_information.png")
    return {"channels": channels, "images": len(images), "fractions": res["fractions"].tolist(),
            "count_ratio": res["count_ratio"].tolist(), "sum_ratio": res["sum_ratio"].tolist(),
            "units_used": res["units_used"].tolist(), "linearity": res["linearity"],
            "figure": str(fig.relative_to(out))}


def _unnormalise(backbone, pixels: torch.Tensor) -> torch.Tensor:
    """Model-normalised pixels ``[B, 3, H, W]`` back to [0, 1] (the spatial test blacks out patches there)."""
    mean = torch.tensor(backbone.spec.mean).view(1, 3, 1, 1)
    std = torch.tensor(backbone.spec.std).view(1, 3, 1, 1)
    return (pixels.cpu() * std + mean).clamp(0, 1)


def _mlp_width(backbone) -> int:
    """Channels of ``blocks.0.mlp.post`` (the FFN hidden width), from one recorded forward."""
    size = backbone.spec.image_size
    with torch.no_grad(), backbone.record(["blocks.0.mlp.post"]) as rec:
        backbone(torch.zeros(1, 3, *size))
    return int(rec["blocks.0.mlp.post"].shape[-1])


def run_featviz(options: FeatvizOptions, log: Callable[[str], None] = lambda s: None) -> Path:
    """Run the command; return the path of ``results.json``."""
    from vitscope.engine.run import resolve_device
    from vitscope.models.load import load_model
    from vitscope.viz.featviz_figures import unit_grid_figure

    out = Path(options.out)
    if not options.units and options.grid <= 0:
        raise ValueError("give at least one --unit (e.g. blocks.5.mlp.post:31) or --grid N")
    objectives = [parse_objective(u) for u in options.units]
    backbone = load_model(options.model)
    device = resolve_device(options.device)
    backbone.to(device).eval()
    if options.grid > 0:
        objectives += grid_units(backbone.spec, options.grid, options.seed)
    cfg = FeatvizConfig(steps=options.steps, seed=options.seed, lambda_tv=options.lambda_tv,
                        augment=AugmentConfig(noise=options.noise, color_shift=options.color_shift))
    log(f"optimising {len(objectives)} units for {cfg.steps} steps on {device}")
    result = _render_chunks(backbone, objectives, cfg, options.chunk, log)
    clean = evaluate(backbone, objectives, result.images).reshape(-1, len(objectives)).diagonal()

    (out / "images").mkdir(parents=True, exist_ok=True)
    from PIL import Image

    files = []
    for name, img in zip(result.names, result.to_uint8()):
        path = out / "images" / f"{_safe(name)}.png"
        Image.fromarray(img.numpy()).save(path)
        files.append(str(path.relative_to(out)))
    _write_history(result, out / "history.csv")
    per_block = options.grid if options.grid > 0 and not options.units else None
    grid_png = unit_grid_figure(result.images, result.names, out / "featviz_grid.png", columns=per_block,
                                title=f"{backbone.spec.name}: optimised images")
    units = {name: {"image": f, "final_loss": float(result.loss[-1, i]), "activation": float(clean[i])}
             for i, (name, f) in enumerate(zip(result.names, files))}
    analyses: dict[str, Any] = {"featviz": {"units": units, "grid_figure": grid_png.name}}
    data_doc: dict[str, Any] = {}
    if options.data:
        from vitscope.data.open import open_dataset
        from vitscope.engine.provenance import data_fingerprint

        dataset = open_dataset(options.data)
        data_doc = {"source": options.data, **data_fingerprint(dataset)}
        top = _top_images(backbone, dataset, objectives, options, out, result, log)
        for name, entry in top.items():
            units[name].update(entry)
        if top:
            analyses["top_activations"] = {"k": options.top_k, "units": len(top)}
        if options.token_mixing:
            analyses["token_mixing"] = _token_mixing(backbone, dataset, options, out)
        if options.spatial_information:
            analyses["spatial_information"] = _spatial_information(backbone, dataset, options, out)
    elif options.token_mixing or options.spatial_information:
        raise ValueError("--token-mixing and --spatial-information need --data (e.g. --data ROOT::imagefolder)")
    doc = {
        "vitscope_version": vitscope.__version__, "python": platform.python_version(),
        "config": {"command": "featviz", "model": options.model, "units": [o.name for o in objectives],
                   "device": str(device), **_jsonable(cfg.to_dict()), "top_k": options.top_k, "limit": options.limit},
        "models": {options.model: backbone.spec.to_dict()},
        "data": data_doc,
        "analyses": analyses,
    }
    path = out / "results.json"
    path.write_text(json.dumps(doc, indent=1, default=str))
    from vitscope.featviz.report_section import write_featviz_report

    write_featviz_report(out, doc)
    return path


def _jsonable(d: dict) -> dict:
    return json.loads(json.dumps(d, default=list))


def _write_history(result: FeatvizResult, path: Path) -> None:
    import csv

    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["step", "unit", "loss", "activation"])
        for step in range(result.loss.shape[0]):
            for u, name in enumerate(result.names):
                writer.writerow([step, name, f"{float(result.loss[step, u]):.6g}",
                                 f"{float(result.activation[step, u]):.6g}"])
