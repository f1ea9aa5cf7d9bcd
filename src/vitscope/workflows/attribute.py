"""``vitscope attribute``: attribution maps of a few images by several methods, written like every command's
outputs (results.json, arrays of the raw maps, a figure of the maps over the images, report.html)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vitscope.analyses.result import SummaryResult
from vitscope.errors import VitscopeUsageError, VitscopeValueError
from vitscope.outputs.folder import check_output
from vitscope.outputs.lock import releasing_outputs

__all__ = ["AttributionMaps", "write_attributions"]


class AttributionMaps(SummaryResult):
    """The attributions of a run: the raw maps go to ``arrays/attributions.npz`` whatever their size."""

    def arrays(self) -> dict[str, Any]:
        return dict(self.tensors)


@releasing_outputs
def write_attributions(model: str, images: Sequence[str | os.PathLike], methods: Sequence[str] | None,
                       out: str | os.PathLike, target: int | None = None, like: str | os.PathLike | None = None,
                       image_size: int | None = None, upsample: bool = False,
                       log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Attribute ``model``'s output on every image with every method and write the run into ``out``.

    Args:
        model: a model name or folder (``vitscope.load_model``).
        images: image files.
        methods: :data:`vitscope.attribution.METHODS` names, each run once; None: the model's defaults
            (:func:`vitscope.attribution.attribute.default_methods`).
        out: the output folder.
        target: a classifier's class (default: each image's predicted class).
        like: an image whose embedding each image is compared with (an embedding model's target; for a
            classifier, the class it predicts for that image).
        image_size: the input size (default: the model's).
        upsample: maps at the image's size.
        log: receives one-line messages (the model's input: size, token grid, preprocessing).

    Returns:
        The ``results.json`` document.
    """
    check_output(out)  # before any work: a wrong --out costs nothing
    import numpy as np
    import torch

    from vitscope.analyses.result import Figure
    from vitscope.attribution import METHODS, attribute
    from vitscope.attribution.attribute import default_methods, require_method
    from vitscope.attribution.score import score_function
    from vitscope.data.images import load_rgb
    from vitscope.engine.provenance import model_identity
    from vitscope.explain.pair_report import explained_embedding
    from vitscope.models.input_size import describe_input
    from vitscope.models.load import load_model
    from vitscope.models.outputs import embedding_hook, embedding_of, logits_of
    from vitscope.models.preprocess import resize_crop
    from vitscope.outputs import RunResult, prepare_output, write_run
    from vitscope.viz.attribution_figures import attribution_grid

    unknown = [m for m in methods or () if m not in METHODS]
    if unknown:
        raise VitscopeUsageError(f"--method: unknown attribution method {unknown[0]!r}; use some of "
                                 f"{', '.join(METHODS)}")
    if methods is not None and not methods:
        raise VitscopeUsageError(f"--method names no method; use some of {', '.join(METHODS)}")
    if not images:
        raise VitscopeValueError("give at least one image")
    backbone = load_model(model, image_size=image_size)
    spec = backbone.spec
    methods = default_methods(backbone) if methods is None else list(dict.fromkeys(methods))
    for method in methods:  # a method the model cannot give: refused before --out is made
        require_method(backbone, method)
    if log:
        log(describe_input(spec))
    pil = [load_rgb(p) for p in images]
    pixels = backbone.preprocess(pil)
    reading = explained_embedding(model, backbone)  # None: a classifier
    pooling, projection = reading if reading is not None else (None, None)
    if target is not None and (like is not None or reading is not None):
        why = ("is scored by one of --target and --like: give one" if reading is None else
               "is an embedding model (its head projects the embedding): give --like IMAGE" if projection is not None
               else "has no classifier head: give --like IMAGE")
        raise VitscopeUsageError(f"--target names a class of a classifier; {spec.name} {why}")
    with torch.no_grad():
        reference = backbone.preprocess([load_rgb(like)]) if like is not None else None
        if reading is None:  # the given class, else the one predicted for --like, else each's
            if target is not None:
                # the attribution's own score refuses a class the head lacks: asked now, before --out is made
                score_function(backbone, int(target), 1)(logits_of(backbone(pixels[:1])))
                chosen: Any = torch.full((len(pil),), int(target), dtype=torch.long)
            else:
                chosen = logits_of(backbone(reference if reference is not None else pixels)).argmax(-1).expand(
                    len(pil))
            what = "logit of " + (f"class {int(target)}" if target is not None else
                                  "the class predicted for the --like image" if reference is not None
                                  else "each image's predicted class")
        else:
            if reference is None:
                raise VitscopeValueError(f"{spec.name} has no classifier head: give --like IMAGE, whose embedding "
                                         "each image's is compared with")
            with backbone.record(embedding_hook(spec)) as rec:
                backbone(reference)
                chosen = embedding_of(backbone, rec[embedding_hook(spec)], pooling, projection)[0]
            what = "cosine of the embedding to the --like image's"
    out = prepare_output(out)  # once the input is known good: a refused one leaves no folder
    maps = {m: attribute(backbone, pixels, chosen, m, upsample=upsample, pooling=pooling, projection=projection).cpu()
            for m in methods}
    shown = [np.asarray(resize_crop(im, spec), dtype=np.uint8) for im in pil]
    names = [Path(p).name for p in images]

    def draw(path: Path) -> list[Path]:
        return attribution_grid(shown, maps, names, f"{spec.name}: attributions of the {what}", path)

    figure = Figure("attributions", draw, "Attributions of every image by every method",
                    f"Each method's map over each image ({what}); colours are scaled per map for display, the raw "
                    "maps are in arrays/attributions.npz.", "Chefer et al. 2021; Sundararajan et al. 2017")
    summary = {"methods": list(methods), "score": what, "images": names,
               "shapes": {m: list(t.shape[1:]) for m, t in maps.items()}}
    if reading is None:
        summary["classes"] = [int(c) for c in chosen]
    result = AttributionMaps("attributions", summary, figures=[figure], tensors=maps,
                           intro="Where the model's output comes from, by each attribution method: raw maps, never "
                                 "normalised; token methods on the token grid, pixel methods on the pixels.")
    path = write_run(out, RunResult(
        "attribute", title=f"vitscope attribute: {model}",
        config={"command": "attribute", "model": model, "methods": list(methods), "target": target,
                "like": None if like is None else str(like), "image_size": image_size, "upsample": upsample},
        results={"attributions": result}, models=[model_identity(model, backbone)],
        data={"name": "images", "images": [str(Path(p).resolve()) for p in images]}, num_images=len(pil)))
    import json

    return json.loads(Path(path).read_text())
