"""The synthetic object classes: hand-made part layouts, extended procedurally beyond the templates.

Classes depend only on ``num_classes`` (never on a seed): class ``c`` is template ``c % 16``; classes
16 and above are deterministic variants of the templates (parts stretched, shapes swapped), named
``class17-bird-v2`` and so on. Every class has 2 to 4 parts and 4 or 5 keypoints; keypoints sit well
inside their part and are not covered by another part of the same object in the canonical layout.
Geometry is normalised so the object fits the unit disc (see :mod:`.shapes` for the frame).
"""

from __future__ import annotations

import numpy as np

from vitscope.data.synthetic.shapes import ClassGeometry, KeypointDef, PartShape
from vitscope.errors import VitscopeValueError

# (name, kind, cx, cy, a, b, angle in degrees); kinds: E ellipse, R rect, T triangle (tip along +u).
_Part = tuple[str, str, float, float, float, float, float]
# (keypoint name, part name, fu, fv) with fu, fv fractions of the part's half sizes.
_Kp = tuple[str, str, float, float]

_KINDS = {"E": "ellipse", "R": "rect", "T": "triangle"}

# fmt: off
TEMPLATES: list[tuple[str, list[_Part], list[_Kp]]] = [
    (
        "fish",
        [("tail", "T", -0.85, 0.0, 0.28, 0.42, 0), ("fin", "T", -0.05, -0.48, 0.2, 0.25, -90),
         ("body", "E", 0.0, 0.0, 0.72, 0.46, 0)],
        [("nose", "body", 0.8, 0.0), ("belly", "body", 0.0, 0.7), ("fin_tip", "fin", 0.3, 0.0),
         ("tail_top", "tail", -0.7, -0.6), ("tail_bottom", "tail", -0.7, 0.6)],
    ),
    (
        "bird",
        [("left_wing", "E", -0.1, -0.55, 0.2, 0.45, 15), ("right_wing", "E", -0.1, 0.55, 0.2, 0.45, -15),
         ("body", "E", 0.0, 0.0, 0.65, 0.28, 0), ("head", "E", 0.7, 0.0, 0.25, 0.25, 0)],
        [("beak", "head", 0.7, 0.0), ("left_wing_tip", "left_wing", 0.0, -0.75),
         ("right_wing_tip", "right_wing", 0.0, 0.75), ("tail_end", "body", -0.8, 0.0),
         ("body_center", "body", 0.0, 0.0)],
    ),
    (
        "car",
        [("cabin", "R", -0.1, -0.35, 0.45, 0.2, 0), ("body", "R", 0.0, 0.1, 0.9, 0.3, 0),
         ("front_wheel", "E", 0.5, 0.42, 0.22, 0.22, 0), ("rear_wheel", "E", -0.5, 0.42, 0.22, 0.22, 0)],
        [("front_wheel_center", "front_wheel", 0.0, 0.0), ("rear_wheel_center", "rear_wheel", 0.0, 0.0),
         ("roof_front", "cabin", 0.7, -0.5), ("roof_rear", "cabin", -0.7, -0.5),
         ("headlight", "body", 0.85, -0.3)],
    ),
    (
        "house",
        [("body", "R", 0.0, 0.25, 0.6, 0.5, 0), ("roof", "T", 0.0, -0.5, 0.35, 0.8, -90),
         ("door", "R", 0.2, 0.5, 0.15, 0.25, 0)],
        [("roof_peak", "roof", 0.45, 0.0), ("roof_left", "roof", -0.7, -0.75), ("roof_right", "roof", -0.7, 0.75),
         ("door_center", "door", 0.0, 0.0), ("wall_bottom_left", "body", -0.8, 0.85)],
    ),
    (
        "rocket",
        [("left_fin", "T", -0.5, -0.38, 0.22, 0.32, -90), ("right_fin", "T", -0.5, 0.38, 0.22, 0.32, 90),
         ("body", "R", -0.1, 0.0, 0.6, 0.26, 0), ("nose", "T", 0.7, 0.0, 0.25, 0.26, 0)],
        [("nose_tip", "nose", 0.4, 0.0), ("left_fin_tip", "left_fin", 0.3, 0.0),
         ("right_fin_tip", "right_fin", 0.3, 0.0), ("exhaust", "body", -0.85, 0.0)],
    ),
    (
        "snowman",
        [("bottom", "E", 0.0, 0.5, 0.42, 0.42, 0), ("middle", "E", 0.0, -0.1, 0.32, 0.32, 0),
         ("head", "E", 0.0, -0.58, 0.22, 0.22, 0), ("hat", "R", 0.0, -0.82, 0.18, 0.1, 0)],
        [("hat_top", "hat", 0.0, -0.5), ("head_center", "head", 0.0, 0.0), ("middle_center", "middle", 0.0, 0.0),
         ("bottom_center", "bottom", 0.0, 0.0)],
    ),
    (
        "hammer",
        [("handle", "R", -0.15, 0.0, 0.75, 0.15, 0), ("head", "R", 0.58, 0.0, 0.2, 0.5, 0)],
        [("handle_end", "handle", -0.85, 0.0), ("grip", "handle", -0.3, 0.0), ("head_top", "head", 0.0, -0.8),
         ("head_bottom", "head", 0.0, 0.8)],
    ),
    (
        "flower",
        [("stem", "R", 0.0, 0.35, 0.09, 0.55, 0), ("leaf", "E", 0.28, 0.42, 0.3, 0.13, -30),
         ("bloom", "E", 0.0, -0.42, 0.45, 0.45, 0), ("pistil", "E", 0.0, -0.42, 0.17, 0.17, 0)],
        [("bloom_center", "pistil", 0.0, 0.0), ("bloom_top", "bloom", 0.0, -0.75), ("leaf_tip", "leaf", 0.7, 0.0),
         ("stem_base", "stem", 0.0, 0.9)],
    ),
    (
        "turtle",
        [("flippers", "E", 0.0, 0.0, 0.18, 0.75, 20), ("tail", "T", -0.7, 0.0, 0.2, 0.12, 180),
         ("shell", "E", 0.0, 0.0, 0.6, 0.45, 0), ("head", "E", 0.72, 0.0, 0.2, 0.16, 0)],
        [("head_tip", "head", 0.6, 0.0), ("tail_tip", "tail", 0.3, 0.0), ("left_flipper", "flippers", 0.0, -0.8),
         ("right_flipper", "flippers", 0.0, 0.8), ("shell_center", "shell", 0.0, 0.0)],
    ),
    (
        "bowtie",
        [("left", "T", -0.5, 0.0, 0.45, 0.55, 0), ("right", "T", 0.5, 0.0, 0.45, 0.55, 180),
         ("knot", "E", 0.0, 0.0, 0.2, 0.2, 0)],
        [("knot_center", "knot", 0.0, 0.0), ("left_top", "left", -0.7, -0.6), ("left_bottom", "left", -0.7, 0.6),
         ("right_top", "right", -0.7, 0.6), ("right_bottom", "right", -0.7, -0.6)],
    ),
    (
        "mushroom",
        [("stem", "R", 0.0, 0.35, 0.2, 0.45, 0), ("cap", "E", 0.0, -0.25, 0.75, 0.4, 0),
         ("spot", "E", 0.25, -0.35, 0.12, 0.12, 0)],
        [("cap_left", "cap", -0.85, 0.0), ("cap_right", "cap", 0.85, 0.0), ("cap_top", "cap", 0.0, -0.8),
         ("stem_base", "stem", 0.0, 0.85), ("spot", "spot", 0.0, 0.0)],
    ),
    (
        "lamp",
        [("pole", "R", 0.0, 0.2, 0.1, 0.55, 0), ("base", "R", 0.0, 0.78, 0.45, 0.12, 0),
         ("shade", "T", 0.0, -0.42, 0.38, 0.62, -90)],
        [("shade_top", "shade", 0.4, 0.0), ("shade_left", "shade", -0.7, -0.7), ("shade_right", "shade", -0.7, 0.7),
         ("base_left", "base", -0.8, 0.0), ("base_right", "base", 0.8, 0.0)],
    ),
    (
        "boat",
        [("sail", "T", 0.05, -0.3, 0.45, 0.55, -90), ("mast", "R", 0.0, -0.3, 0.08, 0.55, 0),
         ("hull", "E", 0.0, 0.45, 0.85, 0.3, 0)],
        [("mast_top", "mast", 0.0, -0.9), ("bow", "hull", 0.85, 0.0), ("stern", "hull", -0.85, 0.0),
         ("sail_left", "sail", -0.6, -0.6)],
    ),
    (
        "butterfly",
        [("left_wing", "E", 0.1, -0.45, 0.35, 0.45, 20), ("right_wing", "E", 0.1, 0.45, 0.35, 0.45, -20),
         ("body", "E", 0.0, 0.0, 0.6, 0.1, 0), ("head", "E", 0.62, 0.0, 0.12, 0.12, 0)],
        [("left_wing_tip", "left_wing", 0.0, -0.8), ("right_wing_tip", "right_wing", 0.0, 0.8),
         ("head", "head", 0.0, 0.0), ("abdomen_end", "body", -0.85, 0.0)],
    ),
    (
        "cup",
        [("handle", "E", 0.45, 0.0, 0.3, 0.3, 0), ("body", "R", -0.1, 0.0, 0.45, 0.55, 0),
         ("liquid", "R", -0.1, -0.42, 0.4, 0.08, 0)],
        [("handle_outer", "handle", 0.7, 0.0), ("upper_left", "body", -0.8, -0.45),
         ("bottom_center", "body", 0.0, 0.85), ("liquid_center", "liquid", 0.0, 0.0)],
    ),
    (
        "tree",
        [("trunk", "R", 0.0, 0.55, 0.12, 0.4, 0), ("crown", "E", 0.0, -0.25, 0.6, 0.55, 0)],
        [("crown_top", "crown", 0.0, -0.8), ("crown_center", "crown", 0.0, 0.0), ("crown_left", "crown", -0.8, 0.0),
         ("trunk_base", "trunk", 0.0, 0.8)],
    ),
]
# fmt: on


def _build(name: str, parts: list[_Part], keypoints: list[_Kp]) -> ClassGeometry:
    shapes = tuple(
        PartShape(pname, _KINDS[kind], (cx, cy), (a, b), float(np.deg2rad(deg)))
        for pname, kind, cx, cy, a, b, deg in parts
    )
    index = {p.name: i for i, p in enumerate(shapes)}
    kps = tuple(KeypointDef(kname, index[pname], (fu, fv)) for kname, pname, fu, fv in keypoints)
    geometry = ClassGeometry(name, shapes, kps)
    factor = 1.0 / geometry.radius()
    return ClassGeometry(name, tuple(p.scaled(factor) for p in shapes), kps)


def keypoints_clear(geometry: ClassGeometry, margin: float = 0.04) -> bool:
    """Whether every keypoint (and a small neighbourhood) lies on its own part in the canonical layout."""
    offsets = np.array([[0.0, 0.0], [margin, 0.0], [-margin, 0.0], [0.0, margin], [0.0, -margin]])
    for kp, point in zip(geometry.keypoints, geometry.canonical_keypoints()):
        pts = point + offsets
        labels = np.full(len(pts), -1)
        for p, part in enumerate(geometry.parts):
            labels[part.contains(pts[:, 0], pts[:, 1])] = p
        if np.any(labels != kp.part):
            return False
    return True


def _variant(parts: list[_Part], class_id: int, attempt: int) -> list[_Part]:
    """Deterministic variation of a template for classes beyond the templates."""
    rng = np.random.default_rng([7919, class_id, attempt])
    stretch_u, stretch_v = rng.uniform(0.75, 1.3, size=2)
    swap = int(rng.integers(len(parts)))
    out = []
    for i, (pname, kind, cx, cy, a, b, deg) in enumerate(parts):
        fa, fb = rng.uniform(0.8, 1.25, size=2)
        if i == swap and kind in "ER":
            kind = "R" if kind == "E" else "E"
        out.append((pname, kind, cx * stretch_u, cy * stretch_v, a * fa * stretch_u, b * fb * stretch_v, deg))
    return out


def make_classes(num_classes: int) -> list[ClassGeometry]:
    """The first ``num_classes`` class geometries (a pure function of ``num_classes``)."""
    if num_classes < 1:
        raise VitscopeValueError(f"num_classes must be >= 1, got {num_classes}")
    out = []
    for c in range(num_classes):
        base, parts, keypoints = TEMPLATES[c % len(TEMPLATES)]
        if c < len(TEMPLATES):
            out.append(_build(f"class{c:02d}-{base}", parts, keypoints))
            continue
        name = f"class{c:02d}-{base}-v{c // len(TEMPLATES) + 1}"
        geometry = _build(name, parts, keypoints)  # fallback: the template itself
        for attempt in range(20):
            candidate = _build(name, _variant(parts, c, attempt), keypoints)
            if keypoints_clear(candidate):
                geometry = candidate
                break
        out.append(geometry)
    return out
