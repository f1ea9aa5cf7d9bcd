"""What the synthetic world produces; every format writer consumes these."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class ClassSpec:
    """A synthetic object class: its parts and its named keypoints (class-specific layout)."""

    name: str
    part_names: tuple[str, ...]
    keypoint_names: tuple[str, ...]


@dataclass
class SceneObject:
    """One object in a scene; masks are what is visible after occlusion.

    Attributes:
        class_id: index into ``SyntheticWorld.classes``.
        instance_id: identity (same colours/texture whenever it reappears).
        mask: ``[H, W]`` bool visible object mask.
        part_masks: ``[P, H, W]`` bool visible part masks, ordered as ``ClassSpec.part_names``.
        box: ``[4]`` float32 box of the visible mask (x2/y2 exclusive); all zeros if fully occluded.
        keypoints: ``[K, 3]`` float32 ``(x, y, visible)`` ordered as ``ClassSpec.keypoint_names``.
        pose: ``{"tx", "ty", "scale", "angle"}`` used to draw it.
    """

    class_id: int
    instance_id: int
    mask: np.ndarray
    part_masks: np.ndarray
    box: np.ndarray
    keypoints: np.ndarray
    pose: dict = field(default_factory=dict)


@dataclass
class Scene:
    """One rendered image with full ground truth.

    Attributes:
        image: ``[H, W, 3]`` uint8.
        background: background type index.
        objects: objects, drawn back to front (later ones occlude earlier ones).
        label: class of the main (largest visible) object.
        index: position in the world's stream (with the seed it determines the scene).
    """

    image: np.ndarray
    background: int
    objects: list[SceneObject]
    label: int
    index: int
