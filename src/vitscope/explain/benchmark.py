"""Scoring explanation methods against ground truth (``vitscope explanations``): every method on every model,
each number beside its control.

Per model and method, on the images of a dataset with object masks and labels:

- localisation: pointing game, relevance mass and AUROC of the map (upsampled to the model input) against the
  union of the object masks, beside the same scores of another image's map (the next image's: a map that knows
  nothing of this image);
- faithfulness: deletion and insertion areas with the mean-colour fill and ROAD's imputation, beside a random
  patch order and another image's map;
- sanity: the mean Spearman correlation of the maps with the trained model's once every block is randomised
  (a method above 0.5 fails);
- shortcut, where each image's background type is known (the synthetic world): the share of positive relevance
  on the background, in scenes whose background follows the class and in scenes where it does not.

The score explained: a classifier's logit of the image's label; a metric-learning net (its head projects the
embedding) or a model without a head, the cosine of the image's embedding to the next image's
(:func:`~vitscope.explain.pair_report.explained_embedding`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from vitscope.attribution import METHODS, attribute
from vitscope.attribution.faithfulness import faithfulness
from vitscope.attribution.sanity import cascading_randomisation
from vitscope.attribution.score import score_function
from vitscope.errors import VitscopeUsageError, VitscopeValueError
from vitscope.explain.pair_report import explained_embedding
from vitscope.functional.explanation_scores import mask_auroc, pointing_game, relevance_mass
from vitscope.models.backbone import Backbone
from vitscope.models.outputs import embedding_hook, embedding_of, logits_of
from vitscope.occlusion.regions import instance_masks_to_model

__all__ = ["FAITHFULNESS_FILLS", "SHORTCUT_MARGIN", "BenchmarkData", "Row", "benchmark_model", "method_parameters",
           "methods_for", "shortcut_rows"]

#: the fills of the faithfulness curves: the dataset's mean colour and ROAD's imputation
FAITHFULNESS_FILLS = ("mean", "road")


@dataclass
class BenchmarkData:
    """The images of the benchmark in one model's input geometry.

    Attributes:
        pixels: ``[B, 3, H, W]`` preprocessed images.
        objects: ``[B, H, W]`` bool union of each image's object masks.
        labels: ``[B]`` class of each image.
        agrees: ``[B]`` bool, whether the image's background follows its class (None when unknown).
        shown: the model inputs as ``[H, W, 3]`` uint8 pictures.
    """

    pixels: torch.Tensor
    objects: torch.Tensor
    labels: torch.Tensor
    agrees: torch.Tensor | None
    shown: list[np.ndarray] = field(default_factory=list)


@dataclass
class Row:
    """One number of the results table and its controls."""

    model: str
    method: str
    family: str  # localisation, faithfulness, sanity, shortcut
    metric: str
    value: float
    controls: dict[str, float] = field(default_factory=dict)
    note: str = ""


def methods_for(backbone: Backbone, requested: Sequence[str] | None) -> tuple[list[str], dict[str, str]]:
    """The methods that run on ``backbone`` and, for the others asked for, why not."""
    chosen = list(METHODS) if not requested or list(requested) == ["all"] else list(requested)
    unknown = [m for m in chosen if m not in METHODS]
    if unknown:
        # a name the caller gave: bad usage (the command line's --methods, exit status 2)
        raise VitscopeUsageError(f"unknown attribution method {unknown[0]!r}; use some of {', '.join(METHODS)}")
    run, skipped = [], {}
    for m in chosen:
        kind = METHODS[m][1]
        if kind == "transformer" and not backbone.spec.is_transformer:
            skipped[m] = "reads attention or tokens; the model is a CNN"
        elif kind == "cnn" and backbone.spec.is_transformer:
            skipped[m] = "is for CNNs"
        else:
            run.append(m)
    return run, skipped


def _defaults(fn: Callable[..., Any], names: Sequence[str] | None = None) -> dict[str, Any]:
    """The keyword defaults of ``fn`` (those in ``names``, or every one), as the benchmark runs it: it passes none
    of them."""
    import inspect

    return {k: p.default for k, p in inspect.signature(fn).parameters.items()
            if p.default is not inspect.Parameter.empty and (names is None or k in names)}


def method_parameters(methods: Sequence[str], faithful: bool = True, sanity: bool = True) -> dict[str, Any]:
    """The fixed settings the scores were made with, read from their definitions: every method's own options
    (integrated gradients' ``steps`` and ``baseline``...), the faithfulness curves' fills, seed and ROAD noise,
    the sanity check's seed and threshold.

    Args:
        methods: the methods scored.
        faithful: the faithfulness curves were drawn; sanity: the cascading randomisation ran.
    """
    out: dict[str, Any] = {m: _defaults(METHODS[m][0]) for m in methods}
    if faithful:
        out["faithfulness"] = {"fills": list(FAITHFULNESS_FILLS), **_defaults(faithfulness, ("seed", "noise"))}
    if sanity:
        out["sanity"] = _defaults(cascading_randomisation, ("seed", "threshold"))
    return out


def prepared(backbone: Backbone, source: Any, limit: int, num_backgrounds: int | None) -> BenchmarkData:
    """The first ``limit`` labelled images of ``source`` with objects, in ``backbone``'s input geometry."""
    from vitscope.models.preprocess import resize_crop

    images, objects, labels, agrees, shown = [], [], [], [], []
    for i in range(len(source)):
        if len(images) == limit:
            break
        image, targets = source.load_checked(i)
        masks, label = targets.get("masks"), targets.get("label")
        if masks is None or label is None or not len(masks):
            continue
        objects.append(instance_masks_to_model(masks, backbone.spec).any(dim=0))
        images.append(image)
        labels.append(int(label))
        item = source.dataset[i] if hasattr(source, "dataset") else None  # a format reader's item: its meta
        background = (getattr(item, "meta", None) or {}).get("background")
        agrees.append(None if background is None or not num_backgrounds else
                      int(background) == int(label) % num_backgrounds)
        shown.append(np.asarray(resize_crop(image, backbone.spec), dtype=np.uint8))
    if len(images) < 2:
        raise VitscopeValueError("the explanations benchmark needs two labelled images with object masks or more "
                                 "(e.g. ROOT::coco of the synthetic world)")
    known = all(a is not None for a in agrees)
    return BenchmarkData(backbone.preprocess(images), torch.stack(objects), torch.as_tensor(labels),
                         torch.as_tensor(agrees) if known else None, shown)


def _in_chunks(fn: Callable[[slice], torch.Tensor], count: int, batch_size: int) -> torch.Tensor:
    """``fn`` of consecutive slices of ``count`` images, ``batch_size`` at a time, concatenated: memory is that
    of one chunk, and each image's value is its own (no method mixes images)."""
    return torch.cat([fn(slice(start, start + batch_size)) for start in range(0, count, batch_size)])


def _model_output(backbone: Backbone, pixels: torch.Tensor, reading: tuple[str, Any] | None,
                  batch_size: int) -> torch.Tensor:
    """``[B, ...]`` what the score reads, ``batch_size`` images at a time: a classifier's logits, else the tokens
    its embedding is read from."""
    source = embedding_hook(backbone.spec)

    def one(part: slice) -> torch.Tensor:
        with torch.no_grad():
            if reading is None:
                return logits_of(backbone(pixels[part]))
            with backbone.record(source) as rec:
                backbone(pixels[part])
                return rec[source]

    return _in_chunks(one, len(pixels), batch_size)


def _targets(backbone: Backbone, data: BenchmarkData, reading: tuple[str, Any] | None, batch_size: int) -> Any:
    """A classifier's labels (``reading`` None); else each image's partner's embedding (the next image), pooled and
    projected as ``reading = (pooling, projection)`` says."""
    if reading is None:
        return data.labels
    with torch.no_grad():
        tokens = _model_output(backbone, data.pixels, reading, batch_size)
        return embedding_of(backbone, tokens, *reading).roll(-1, 0)


def _upsampled(maps: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    if tuple(maps.shape[-2:]) == tuple(size):
        return maps
    return torch.nn.functional.interpolate(maps[:, None].float(), size=size, mode="bilinear",
                                           align_corners=False)[:, 0]


def _patch_maps(maps: torch.Tensor, backbone: Backbone, size: tuple[int, int]) -> torch.Tensor:
    """Maps on a grid of patches that tiles the input (pixel maps pooled to the token grid, or a CNN's map)."""
    grid = backbone.spec.grid
    if tuple(maps.shape[-2:]) == tuple(grid) and size[0] % grid[0] == 0 and size[1] % grid[1] == 0:
        return maps
    return torch.nn.functional.adaptive_avg_pool2d(_upsampled(maps, size)[:, None], grid)[:, 0]


def benchmark_model(backbone: Backbone, name: str, data: BenchmarkData, methods: Sequence[str], steps: int = 8,
                    sanity: bool = True, say: Callable[[str], None] | None = None, batch_size: int = 16,
                    progress: bool | None = None
                    ) -> tuple[list[Row], dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """Every score of every method on one model: ``(rows, maps by method, mean curves by method)``.

    Attributions and forwards run ``batch_size`` images at a time; the faithfulness curves' perturbed copies of
    every image at every step are made at once (``limit * (steps + 1)`` images). ``progress`` counts the stages
    (each method's maps, each fill's curves, its sanity check) as :func:`vitscope.run` counts images."""
    from vitscope.engine.settings import progress_bar

    size = tuple(data.pixels.shape[-2:])
    reading = explained_embedding(name, backbone)
    pooling, projection = reading if reading is not None else (None, None)
    target = _targets(backbone, data, reading, batch_size)
    score = score_function(backbone, target, len(data.pixels), pooling, projection)

    def explain(b: Backbone, method: str) -> torch.Tensor:  # the projection is b's own head (a randomised copy's)
        read = explained_embedding(name, b)
        return _in_chunks(lambda part: attribute(b, data.pixels[part], target[part], method, pooling=pooling,
                                                 projection=None if read is None else read[1]).cpu(),
                          len(data.pixels), batch_size)

    def model_score(x: torch.Tensor) -> torch.Tensor:
        return score(_model_output(backbone, x, reading, batch_size))

    rows: list[Row] = []
    all_maps: dict[str, torch.Tensor] = {}
    curves: dict[str, dict[str, torch.Tensor]] = {}
    checks = sanity and backbone.spec.is_transformer
    with progress_bar(progress) as bar:
        stage = bar.add_task(f"{name} explanations", total=len(methods) * (1 + len(FAITHFULNESS_FILLS) + checks),
                             unit="stages")
        for method in methods:
            if say:
                say(f"{name}: {method}")
            maps = explain(backbone, method).cpu()
            all_maps[method] = maps
            bar.advance(stage)
            pixel_maps, other = _upsampled(maps, size), _upsampled(maps.roll(-1, 0), size)
            for metric, fn in (("pointing_game", lambda m: pointing_game(m, data.objects).double()),
                               ("relevance_mass", lambda m: relevance_mass(m, data.objects)),
                               ("auroc", lambda m: mask_auroc(m, data.objects))):
                rows.append(Row(name, method, "localisation", metric, float(fn(pixel_maps).nanmean()),
                                {"other_image": float(fn(other).nanmean())}))
            patch_maps = _patch_maps(maps, backbone, size)
            for fill in FAITHFULNESS_FILLS:
                result = faithfulness(model_score, data.pixels, patch_maps, steps=steps, fill=fill)
                for mode in ("deletion", "insertion"):
                    rows.append(Row(name, method, "faithfulness", f"{mode}_{fill}",
                                    float(result.areas["map"][mode].mean()),
                                    {o: float(result.areas[o][mode].mean()) for o in ("random", "other_image")},
                                    "lower is better" if mode == "deletion" else "higher is better"))
                    curves.setdefault(method, {})[f"{mode}_{fill}"] = result.curves["map"][mode].mean(0)
                bar.advance(stage)
            if checks:
                check = cascading_randomisation(backbone, lambda b, m=method: explain(b, m))
                rows.append(Row(name, method, "sanity", "spearman_after_randomising_all", check.final,
                                {"threshold": check.threshold}, "passes" if check.passes else
                                "fails: the map barely changes when the model is destroyed"))
                bar.advance(stage)
            background = 1 - relevance_mass(pixel_maps, data.objects)
            uniform = 1 - data.objects.double().flatten(1).mean(1)  # what a map spread evenly puts off the objects
            rows.append(Row(name, method, "shortcut", "background_share", float(background.nanmean()),
                            {"uniform_map": float(uniform.mean())}, "relevance off the objects, every scene"))
            if data.agrees is not None and data.agrees.any() and (~data.agrees).any():
                rows.append(Row(name, method, "shortcut", "background_share_agreeing",
                                float(background[data.agrees].nanmean()),
                                {"disagreeing": float(background[~data.agrees].nanmean())},
                                "background that follows the class vs background that does not"))
    return rows, all_maps, curves


#: how much more relevance a biased model's maps must put off the objects than its unbiased twin's for a method to
#: show the shortcut
SHORTCUT_MARGIN = 0.02


def shortcut_rows(rows: Sequence[Row]) -> list[Row]:
    """For every model ``X-spurious`` run beside ``X``: per method, its background share against ``X``'s, and
    whether the method shows the shortcut (more than :data:`SHORTCUT_MARGIN` above) or cannot."""
    shares = {(r.model, r.method): r.value for r in rows if r.family == "shortcut" and r.metric == "background_share"}
    out = []
    for (model, method), value in shares.items():
        twin = model.removesuffix("-spurious")
        if twin == model or (twin, method) not in shares:
            continue
        unbiased = shares[(twin, method)]
        shows = value > unbiased + SHORTCUT_MARGIN
        out.append(Row(model, method, "shortcut", "background_share_vs_unbiased_twin", value,
                       {"unbiased_twin": unbiased}, f"shows the shortcut (more than {SHORTCUT_MARGIN} above {twin})"
                       if shows else f"cannot show the shortcut (not more than {SHORTCUT_MARGIN} above {twin})"))
    return out

