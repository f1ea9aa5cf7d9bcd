"""What the ``sae_features`` cards need beyond the pass: the pictures of the card latents' top images (the pass keeps
pictures only for the first latents, as it cannot know which latents will be drawn) and the feature visualisation of
each card latent's encoder direction."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from vitscope.analyses.activations.sae_features_result import SAEFeaturesResult
from vitscope.analyses.activations.top import PICTURE_SIDE
from vitscope.autoencoders.files import load
from vitscope.data.images import ImageLoadError
from vitscope.data.source import Source
from vitscope.featviz.latents import latent_pictures
from vitscope.models.backbone import Backbone
from vitscope.models.preprocess import resize_crop

__all__ = ["finish_sae_cards"]


def finish_sae_cards(results: Mapping[str, Any], backbone: Backbone, source: Source,
                     log: Callable[[str], None] | None = None) -> None:
    """Complete every ``sae_features`` result of ``results`` in place: pictures of the card images, and the
    feature visualisations of the card latents (``featviz_steps`` of the analysis; 0: none)."""
    for result in results.values():
        if not isinstance(result, SAEFeaturesResult) or not result.meta.get("cards"):
            continue
        _pictures(result, backbone, source)
        _names(result, source)
        steps = int(result.meta.get("featviz_steps") or 0)
        sae_meta = result.meta.get("sae") or {}
        if steps and sae_meta.get("path") and sae_meta.get("hook"):
            if log:
                log(f"{result.name}: feature visualisation of {len(result.meta['cards'])} latent directions "
                    f"({steps} steps)")
            sae = load(sae_meta["path"])
            cards = [int(c) for c in result.meta["cards"]]
            result.tensors["featviz"] = latent_pictures(backbone, sae, sae_meta["hook"], cards, steps)
            result.meta["featviz_latents"] = cards


def _pictures(result: SAEFeaturesResult, backbone: Backbone, source: Source) -> None:
    """Add the ``[S, S, 3]`` uint8 picture, as the model sees it, of every top image of the card latents."""
    hook = result.meta["sae"]["hook"]
    order = list(result.meta["channels"][hook])
    rows = [order.index(int(c)) for c in result.meta["cards"]]
    wanted = {int(i) for r in rows for i, s in zip(result.tensors[f"{hook}.indices"][r].tolist(),
                                                   result.tensors[f"{hook}.scores"][r].tolist()) if s > 0}
    held = list(result.meta.get("picture_indices", []))
    pictures = {i: p for i, p in zip(held, result.tensors["pictures"])} if "pictures" in result.tensors else {}
    for i in sorted(wanted - set(pictures)):
        try:
            image = source.load_checked(i)[0]
        except ImageLoadError:  # the card draws the map alone
            continue
        seen = resize_crop(image.convert("RGB"), backbone.spec).resize((PICTURE_SIDE, PICTURE_SIDE))
        pictures[i] = torch.from_numpy(np.asarray(seen, dtype=np.uint8).copy())
    if pictures:
        kept = sorted(pictures)
        result.tensors["pictures"] = torch.stack([pictures[i] for i in kept])
        result.meta["picture_indices"] = kept


def _names(result: SAEFeaturesResult, source: Source) -> None:
    """Name the classes and regions of the cards where the data has names: image classes from the source's own
    ``class_names`` (a Hugging Face ClassLabel's), else its reader's ``classes``; regions from the reader's
    ``part_names`` (PartImageNet) or ``classes`` (COCO categories)."""
    reader = getattr(source, "dataset", None)
    classes, parts = getattr(reader, "classes", None), getattr(reader, "part_names", None)
    own = getattr(source, "class_names", None)
    image_classes = own if isinstance(own, (list, tuple)) and own else classes
    for key, names in (("class", image_classes), ("region", parts if parts is not None else classes)):
        if not isinstance(names, (list, tuple)):
            continue
        named = {int(v): str(names[int(v)]) for v in result.meta.get(f"{key}_labels", []) if 0 <= int(v) < len(names)}
        if named:
            result.meta[f"{key}_names"] = {str(v): n for v, n in named.items()}
