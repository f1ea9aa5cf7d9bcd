"""Compositing of synthetic objects: occlusion, visible masks, boxes, keypoint visibility, pixels.

Objects are drawn back to front (painter's algorithm): a later object covers an earlier one, and inside
an object a later part covers an earlier part. Every mask is the *visible* region after both kinds of
covering, so an object's part masks partition its mask.

A keypoint is visible when its pixel ``(int(y), int(x))`` lies inside the image and shows the keypoint's
own part of its own object (not another object, not another part, not the background).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vitscope.data.synthetic.scene import Scene, SceneObject
from vitscope.data.synthetic.shapes import ClassGeometry, Raster, object_keypoints, rasterize
from vitscope.data.synthetic.textures import Appearance, paint
from vitscope.errors import VitscopeValueError


@dataclass(frozen=True)
class ObjectSpec:
    """What to draw: an object of a class and instance under a pose (see :mod:`.shapes` for poses).

    Attributes:
        class_id: index of the class.
        instance_id: ``class_id * num_instances_per_class + k``.
        pose: ``{"tx", "ty", "scale", "angle"}`` (pixels, pixels, bounding radius in pixels, radians).
    """

    class_id: int
    instance_id: int
    pose: dict


@dataclass
class Layout:
    """Objects rasterised and stacked, before colouring.

    Attributes:
        size: image side in pixels.
        owner: ``[H, W]`` int8 index of the visible object per pixel, -1 for background.
        part: ``[H, W]`` int8 part index of the visible object per pixel, -1 for background.
        rasters: per object its :class:`Raster` (None when it misses the image).
    """

    size: int
    owner: np.ndarray
    part: np.ndarray
    rasters: list[Raster | None]

    def visible_areas(self) -> np.ndarray:
        """``[n]`` number of visible pixels of each object."""
        return np.bincount(self.owner.ravel() + 1, minlength=len(self.rasters) + 1)[1:]


def layout(specs: Sequence[ObjectSpec], geometries: Sequence[ClassGeometry], size: int) -> Layout:
    """Rasterise ``specs`` in drawing order and resolve occlusion."""
    if len(specs) > 127:
        raise VitscopeValueError(f"at most 127 objects per scene, got {len(specs)}")
    owner = np.full((size, size), -1, dtype=np.int8)
    part = np.full((size, size), -1, dtype=np.int8)
    rasters: list[Raster | None] = []
    for i, spec in enumerate(specs):
        r = rasterize(geometries[spec.class_id], spec.pose, size)
        rasters.append(r)
        if r is None:
            continue
        h, w = r.labels.shape
        inside = r.labels >= 0
        owner[r.y0 : r.y0 + h, r.x0 : r.x0 + w][inside] = i
        part[r.y0 : r.y0 + h, r.x0 : r.x0 + w][inside] = r.labels[inside]
    return Layout(size=size, owner=owner, part=part, rasters=rasters)


def compose(lay: Layout, appearances: Sequence[Appearance], background: np.ndarray) -> np.ndarray:
    """Paint the objects of ``lay`` over ``background`` ``[H, W, 3]`` uint8; returns a new image."""
    image = background.copy()
    for r, app in zip(lay.rasters, appearances):
        if r is None:
            continue
        h, w = r.labels.shape
        inside = r.labels >= 0
        if not inside.any():
            continue
        image[r.y0 : r.y0 + h, r.x0 : r.x0 + w][inside] = paint(app, r.labels[inside], r.u[inside], r.v[inside])
    return image


def box_of(mask: np.ndarray) -> np.ndarray:
    """``[4]`` float32 ``[x1, y1, x2, y2]`` (x2/y2 exclusive) of a ``[H, W]`` bool mask; zeros if empty."""
    rows = np.flatnonzero(mask.any(axis=1))
    if rows.size == 0:
        return np.zeros(4, dtype=np.float32)
    cols = np.flatnonzero(mask.any(axis=0))
    return np.array([cols[0], rows[0], cols[-1] + 1, rows[-1] + 1], dtype=np.float32)


def scene_objects(lay: Layout, specs: Sequence[ObjectSpec], geometries: Sequence[ClassGeometry]) -> list[SceneObject]:
    """Ground truth of every object of ``lay``: visible masks, part masks, boxes, keypoints."""
    size = lay.size
    objects = []
    for i, spec in enumerate(specs):
        geom = geometries[spec.class_id]
        mask = lay.owner == i
        num_parts = len(geom.parts)
        part_masks = (lay.part[None] == np.arange(num_parts, dtype=np.int8)[:, None, None]) & mask[None]
        xy = object_keypoints(geom, spec.pose)
        kp_parts = np.array([k.part for k in geom.keypoints])
        col, row = np.floor(xy[:, 0]).astype(int), np.floor(xy[:, 1]).astype(int)
        inside = (col >= 0) & (col < size) & (row >= 0) & (row < size)
        rc, cc = np.clip(row, 0, size - 1), np.clip(col, 0, size - 1)
        visible = inside & (lay.owner[rc, cc] == i) & (lay.part[rc, cc] == kp_parts)
        keypoints = np.concatenate([xy, visible[:, None].astype(np.float32)], axis=1)
        objects.append(
            SceneObject(
                class_id=int(spec.class_id),
                instance_id=int(spec.instance_id),
                mask=mask,
                part_masks=part_masks,
                box=box_of(mask),
                keypoints=keypoints.astype(np.float32),
                pose={k: float(v) for k, v in spec.pose.items()},
            )
        )
    return objects


def main_object(lay: Layout) -> int:
    """Index of the object with the largest visible area (the first one on ties)."""
    return int(np.argmax(lay.visible_areas()))


def build_scene(
    lay: Layout,
    specs: Sequence[ObjectSpec],
    geometries: Sequence[ClassGeometry],
    appearances: Sequence[Appearance],
    background: int,
    background_pixels: np.ndarray,
    index: int,
) -> Scene:
    """Colour ``lay`` over ``background_pixels`` and gather the ground truth into a :class:`Scene`."""
    image = compose(lay, appearances, background_pixels)
    objects = scene_objects(lay, specs, geometries)
    label = objects[main_object(lay)].class_id if objects else -1
    return Scene(image=image, background=int(background), objects=objects, label=int(label), index=int(index))
