"""Part geometry of synthetic objects and its rasterisation under a pose.

Coordinate conventions (shared by the whole synthetic world):

* Image coordinates are continuous pixels, ``x`` to the right and ``y`` down; the pixel in row ``r``
  and column ``c`` covers ``[c, c + 1) x [r, r + 1)``, so its centre is ``(c + 0.5, r + 0.5)`` and a
  point ``(x, y)`` lies in pixel ``(int(y), int(x))``. Shapes are evaluated at pixel centres.
* Each class is defined in its *canonical frame*: same axes as the image (``u`` right, ``v`` down), the
  object's "front" towards ``+u``, its "top" towards ``-v``, and the whole object inside the unit disc.
* A pose ``{"tx", "ty", "scale", "angle"}`` maps canonical ``(u, v)`` to the image:
  ``(x, y) = (tx, ty) + scale * R(angle) @ (u, v)`` with ``R`` the usual rotation matrix; ``scale`` is
  the radius in pixels of the object's bounding disc and ``angle`` is in radians (positive angles turn
  the object clockwise on screen, because ``y`` points down).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vitscope.data.synthetic.scene import ClassSpec
from vitscope.errors import VitscopeValueError

SHAPE_KINDS = ("ellipse", "rect", "triangle")


@dataclass(frozen=True)
class PartShape:
    """One part of a class: a primitive shape placed in the canonical frame.

    Attributes:
        name: part name (e.g. ``"head"``).
        kind: ``"ellipse"``, ``"rect"`` or ``"triangle"``.
        center: ``(u, v)`` centre in the canonical frame (for triangles: the middle of the bounding box).
        half_size: ``(a, b)`` half extents along the part's own axes. A triangle has its tip at ``(a, 0)``
            and its base corners at ``(-a, -b)`` and ``(-a, b)``.
        angle: rotation of the part's axes relative to the canonical frame, radians.
    """

    name: str
    kind: str
    center: tuple[float, float]
    half_size: tuple[float, float]
    angle: float = 0.0

    def radius(self) -> float:
        """Largest distance from the canonical origin to any point of the part."""
        a, b = self.half_size
        if self.kind == "ellipse":
            return float(np.hypot(*self.center) + max(a, b))
        if self.kind == "rect":
            local = np.array([[a, b], [a, -b], [-a, b], [-a, -b]])
        else:
            local = np.array([[a, 0.0], [-a, b], [-a, -b]])
        return float(np.linalg.norm(self.to_object(local), axis=1).max())

    def area(self) -> float:
        """Area of the primitive in canonical units (ignoring overlap with other parts)."""
        a, b = self.half_size
        return {"ellipse": np.pi * a * b, "rect": 4.0 * a * b, "triangle": 2.0 * a * b}[self.kind]

    def to_object(self, local: np.ndarray) -> np.ndarray:
        """Map ``[n, 2]`` points from the part frame (absolute units) to the canonical frame."""
        c, s = np.cos(self.angle), np.sin(self.angle)
        rot = np.array([[c, -s], [s, c]])
        return local @ rot.T + np.asarray(self.center)

    def contains(self, u: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Boolean mask of canonical points ``(u, v)`` (any broadcastable shapes) inside the part."""
        c, s = np.cos(self.angle), np.sin(self.angle)
        du, dv = u - self.center[0], v - self.center[1]
        pu = c * du + s * dv
        pv = c * dv - s * du
        a, b = self.half_size
        if self.kind == "ellipse":
            return (pu / a) ** 2 + (pv / b) ** 2 <= 1.0
        if self.kind == "rect":
            return (np.abs(pu) <= a) & (np.abs(pv) <= b)
        if self.kind == "triangle":
            return (pu >= -a) & (np.abs(pv) * (2.0 * a) <= b * (a - pu))
        raise VitscopeValueError(f"unknown part kind {self.kind!r}; expected one of {SHAPE_KINDS}")

    def scaled(self, factor: float) -> PartShape:
        """The same part with every length multiplied by ``factor``."""
        return PartShape(
            self.name,
            self.kind,
            (self.center[0] * factor, self.center[1] * factor),
            (self.half_size[0] * factor, self.half_size[1] * factor),
            self.angle,
        )


@dataclass(frozen=True)
class KeypointDef:
    """A named keypoint attached to a part.

    Attributes:
        name: keypoint name (e.g. ``"nose"``).
        part: index of the part it belongs to (visibility is judged against that part's visible mask).
        local: ``(fu, fv)`` position in the part frame as fractions of the part's half sizes.
    """

    name: str
    part: int
    local: tuple[float, float]


@dataclass(frozen=True)
class ClassGeometry:
    """Full geometry of one class: parts in drawing order (later parts cover earlier ones) and keypoints."""

    name: str
    parts: tuple[PartShape, ...]
    keypoints: tuple[KeypointDef, ...]

    @property
    def spec(self) -> ClassSpec:
        """The public description (names only)."""
        return ClassSpec(
            name=self.name,
            part_names=tuple(p.name for p in self.parts),
            keypoint_names=tuple(k.name for k in self.keypoints),
        )

    def radius(self) -> float:
        """Radius of the bounding disc around the canonical origin."""
        return max(p.radius() for p in self.parts)

    def canonical_keypoints(self) -> np.ndarray:
        """``[K, 2]`` keypoint positions in the canonical frame."""
        out = np.zeros((len(self.keypoints), 2))
        for i, kp in enumerate(self.keypoints):
            part = self.parts[kp.part]
            local = np.array([[kp.local[0] * part.half_size[0], kp.local[1] * part.half_size[1]]])
            out[i] = part.to_object(local)[0]
        return out

    def coverage(self, resolution: int = 96) -> float:
        """Fraction of the unit disc covered by the object (estimated on a ``resolution``-pixel grid)."""
        t = (np.arange(2 * resolution) + 0.5) / resolution - 1.0
        u, v = t[None, :], t[:, None]
        inside = np.zeros((2 * resolution, 2 * resolution), dtype=bool)
        for part in self.parts:
            inside |= part.contains(u, v)
        return float(inside.sum() / (np.pi * resolution**2))

    def main_part(self) -> int:
        """Index of the part with the largest area (it carries the class's colour cue)."""
        return int(np.argmax([p.area() for p in self.parts]))


def canonical_to_image(points: np.ndarray, pose: dict) -> np.ndarray:
    """Map ``[n, 2]`` canonical points to image pixel coordinates under ``pose``."""
    c, s = np.cos(pose["angle"]), np.sin(pose["angle"])
    rot = np.array([[c, -s], [s, c]])
    return pose["scale"] * np.asarray(points, dtype=np.float64) @ rot.T + np.array([pose["tx"], pose["ty"]])


def image_to_canonical(x: np.ndarray, y: np.ndarray, pose: dict) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`canonical_to_image` for broadcastable coordinate arrays ``x``, ``y``."""
    c, s = np.cos(pose["angle"]), np.sin(pose["angle"])
    dx, dy = x - pose["tx"], y - pose["ty"]
    inv = 1.0 / pose["scale"]
    return (c * dx + s * dy) * inv, (c * dy - s * dx) * inv


def object_keypoints(geometry: ClassGeometry, pose: dict) -> np.ndarray:
    """``[K, 2]`` float32 image coordinates ``(x, y)`` of a class's keypoints under ``pose``."""
    return canonical_to_image(geometry.canonical_keypoints(), pose).astype(np.float32)


@dataclass
class Raster:
    """One object rasterised inside its window of the image (before occlusion by other objects).

    Attributes:
        y0, x0: top-left pixel of the window.
        labels: ``[h, w]`` int8 part index per pixel, -1 outside the object (parts drawn in order).
        u, v: ``[h, w]`` canonical coordinates of the pixel centres (used for textures).
    """

    y0: int
    x0: int
    labels: np.ndarray
    u: np.ndarray
    v: np.ndarray


def rasterize(geometry: ClassGeometry, pose: dict, size: int) -> Raster | None:
    """Rasterise ``geometry`` under ``pose`` on a ``size x size`` image.

    Only the window covering the object's bounding disc is evaluated: its pixel centres are mapped to
    the canonical frame and tested against each part's inequality.

    Returns:
        The object's :class:`Raster`, or None when the bounding disc misses the image.
    """
    reach = pose["scale"] * geometry.radius() + 1.0
    x0 = max(int(np.floor(pose["tx"] - reach)), 0)
    x1 = min(int(np.ceil(pose["tx"] + reach)) + 1, size)
    y0 = max(int(np.floor(pose["ty"] - reach)), 0)
    y1 = min(int(np.ceil(pose["ty"] + reach)) + 1, size)
    if x1 <= x0 or y1 <= y0:
        return None
    xs = np.arange(x0, x1, dtype=np.float32)[None, :] + 0.5
    ys = np.arange(y0, y1, dtype=np.float32)[:, None] + 0.5
    u, v = image_to_canonical(xs, ys, pose)
    labels = np.full(u.shape, -1, dtype=np.int8)
    for p, part in enumerate(geometry.parts):
        labels[part.contains(u, v)] = p
    return Raster(y0=y0, x0=x0, labels=labels, u=u.astype(np.float32), v=v.astype(np.float32))
