"""Synthetic scenes and placeholder image files shared by the dataset-format tests
(test_formats_retrieval.py, test_formats_video.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vitscope.data.synthetic.scene import ClassSpec, Scene, SceneObject


def make_scene(objs: list[dict], h: int = 32, w: int = 48, index: int = 0) -> Scene:
    """Rectangles drawn back to front; ``objs``: dicts with inst, cls, rect (x1, y1, x2, y2), kps."""
    rng = np.random.default_rng(index)
    image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    masks = []
    for o in objs:
        x1, y1, x2, y2 = o["rect"]
        m = np.zeros((h, w), dtype=bool)
        m[y1:y2, x1:x2] = True
        for prev in masks:
            prev &= ~m
        masks.append(m)
    objects = []
    for o, m in zip(objs, masks):
        ys, xs = np.nonzero(m)
        box = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1] if xs.size else [0] * 4, dtype=np.float32)
        kps = np.asarray(o.get("kps", np.zeros((0, 3))), dtype=np.float32).reshape(-1, 3)
        objects.append(SceneObject(o.get("cls", 0), o["inst"], m, np.zeros((0, h, w), dtype=bool), box, kps, pose={}))
    areas = [m.sum() for m in masks]
    label = objects[int(np.argmax(areas))].class_id if objects else 0
    return Scene(image=image, background=0, objects=objects, label=label, index=index)


def touch_images(paths: list[Path]) -> None:
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"")  # 0-byte: readers must not decode images when constructed or indexed


SPECS = [
    ClassSpec("cat", ("body",), ("nose", "l_eye", "r_eye", "tail")),
    ClassSpec("car", ("body",), ("wheel_fl", "wheel_fr")),
]
