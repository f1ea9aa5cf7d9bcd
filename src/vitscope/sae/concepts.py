"""The concepts of the synthetic world, known for every token: object class, object part, background type, object
or background, and colour.

Every pixel of a scene belongs to one segment (the background, or one part of one visible object); a segment belongs
to a few concepts. A token holds a concept when more than half of its pixels belong to it after the model's own
resize and centre crop (:func:`~vitscope.models.preprocess.resize_crop` with the nearest filter, as masks are
resized, then :func:`~vitscope.functional.concept_tokens.token_concepts`).

Colour: the hue of a part's colour in six bins of 60 degrees centred on red, yellow, green, cyan, blue and magenta.
Both colours of a part (its pattern's primary and secondary) share its hue, so every object pixel has the colour of
its part; the background has none (its colours are muted). The main part's hue is near its class's hue, so colour
and class overlap; the other parts' hues are free.
"""

from __future__ import annotations

import colorsys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from vitscope.data.synthetic.scene import Scene
from vitscope.data.synthetic.world import SyntheticWorld
from vitscope.functional.concept_tokens import token_concepts
from vitscope.models.preprocess import resize_crop
from vitscope.models.spec import ModelSpec

__all__ = ["COLOURS", "FAMILIES", "Concept", "concept_labels", "hue_bin", "world_concepts"]

#: the concept families, in the order tables list them
FAMILIES = ("class", "part", "background", "object", "colour")
#: the six hue bins, each 60 degrees wide and centred on its colour
COLOURS = ("red", "yellow", "green", "cyan", "blue", "magenta")


@dataclass(frozen=True)
class Concept:
    """One concept: its family (:data:`FAMILIES`) and its name within it.

    Names: ``class`` the class's name (``class00-fish``); ``part`` ``<class>.<part>``; ``background`` the
    background type (``stripes``); ``object`` ``object`` or ``background`` (the two halves of every image);
    ``colour`` one of :data:`COLOURS`.
    """

    family: str
    name: str

    @property
    def key(self) -> str:
        """``family/name``, unique among a world's concepts."""
        return f"{self.family}/{self.name}"

    @property
    def context(self) -> str | None:
        """The key of the concept whose tokens this one is told apart within (from its siblings, with no help from
        telling objects from background): a class or a colour among the object tokens, a part among its class's
        tokens, a background type among the background tokens; None for object and background."""
        if self.family in ("class", "colour"):
            return "object/object"
        if self.family == "part":
            return f"class/{self.name.split('.')[0]}"
        return "object/background" if self.family == "background" else None


def hue_bin(rgb: Sequence[float]) -> int:
    """The index in :data:`COLOURS` of an RGB colour (0-255) by its hue."""
    r, g, b = (float(v) / 255.0 for v in rgb)
    return int(np.floor(colorsys.rgb_to_hsv(r, g, b)[0] * 6 + 0.5)) % 6


def world_concepts(world: SyntheticWorld) -> list[Concept]:
    """Every concept of ``world``, family by family (:data:`FAMILIES`)."""
    found = [Concept("class", c.name) for c in world.classes]
    found += [Concept("part", f"{c.name}.{p}") for c in world.classes for p in c.part_names]
    found += [Concept("background", name) for name in world.background_names]
    found += [Concept("object", "object"), Concept("object", "background")]
    return found + [Concept("colour", name) for name in COLOURS]


def _segments(scene: Scene, world: SyntheticWorld, index: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """A scene's pixels as segments: ``[H, W]`` int32 segment of every pixel and ``[S, C]`` bool concepts of each
    segment (segment 0 the background)."""
    rows = [{"object/background", f"background/{world.background_names[scene.background]}"}]
    labels = np.zeros(scene.image.shape[:2], dtype=np.int32)
    for obj in scene.objects:
        spec = world.classes[obj.class_id]
        colours = world.appearance(obj.instance_id).colours
        whole = {f"class/{spec.name}", "object/object"}
        in_part = np.zeros_like(obj.mask, dtype=bool)
        for p, part in enumerate(obj.part_masks):
            labels[part] = len(rows)
            rows.append(whole | {f"part/{spec.name}.{spec.part_names[p]}", f"colour/{COLOURS[hue_bin(colours[p, 0])]}"})
            in_part |= part
        rest = obj.mask & ~in_part  # object pixels of no part (none in this world's drawings): class and object
        if rest.any():
            labels[rest] = len(rows)
            rows.append(whole)
    membership = np.zeros((len(rows), len(index)), dtype=bool)
    for s, keys in enumerate(rows):
        membership[s, [index[k] for k in keys]] = True
    return labels, membership


def concept_labels(scenes: Sequence[Scene], world: SyntheticWorld, spec: ModelSpec,
                   concepts: Sequence[Concept] | None = None) -> np.ndarray:
    """Which concepts every spatial token of every scene holds, on ``spec``'s token grid.

    Args:
        scenes: scenes of ``world``; world: the world that drew them (classes, appearances, backgrounds).
        spec: the model (its resize, crop and patch size).
        concepts: the concepts (default :func:`world_concepts`), in the order of the last axis.

    Returns:
        ``[B, h*w, C]`` bool, tokens row-major: a token holds a concept when more than half of its pixels do.
    """
    concepts = list(concepts) if concepts is not None else world_concepts(world)
    index = {c.key: i for i, c in enumerate(concepts)}
    out = []
    for scene in scenes:
        labels, membership = _segments(scene, world, index)
        frame = np.asarray(resize_crop(Image.fromarray(labels), spec, resample=Image.Resampling.NEAREST))
        grid = spec.grid_for(*frame.shape[:2])
        frame = frame[: grid[0] * spec.patch_size, : grid[1] * spec.patch_size]  # the pixels the patches see
        out.append(token_concepts(torch.from_numpy(frame.astype(np.int64))[None], torch.from_numpy(membership),
                                  grid)[0].numpy())
    return np.stack(out)
