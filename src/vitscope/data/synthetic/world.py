"""Procedural world of part-based objects on textured backgrounds, with full ground truth.

Every output is a pure function of the world's settings, its ``seed`` and the requested ``index``: each
scene, pair or video draws from its own generator ``np.random.default_rng([seed, index, salt])``, so
``world.scene(7)`` is the same whatever was generated before. Classes depend only on ``num_classes``
and instance appearances only on ``(class_id, k)``: worlds with different seeds share classes and
instances and differ in poses, backgrounds and which instances appear (use another seed for a held-out
split of the same instances).

Spurious correlation: with ``spurious=p`` the background type of a scene is ``label % num_backgrounds``
with probability ``p`` and uniform over the ``num_backgrounds`` types otherwise, so background and class
agree with probability ``p + (1 - p) / num_backgrounds``. ``spurious=None`` (the default) or ``0`` makes
the background independent of the class.

Run ``python -m vitscope.data.synthetic.world --bench`` to time generation.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator, Sequence

import numpy as np

from vitscope.data.synthetic.classes import make_classes
from vitscope.data.synthetic.render import Layout, ObjectSpec, build_scene, layout, main_object
from vitscope.data.synthetic.scene import ClassSpec, Scene
from vitscope.data.synthetic.shapes import ClassGeometry, object_keypoints
from vitscope.data.synthetic.textures import BACKGROUND_NAMES, Appearance, background_image, instance_appearance
from vitscope.errors import VitscopeValueError

_SALT_SCENE, _SALT_PAIR, _SALT_VIDEO, _SALT_RENDER = 11, 22, 33, 44


class SyntheticWorld:
    """Generator of scenes, keypoint pairs and short videos of part-based objects.

    Args:
        num_classes: number of object classes (see :mod:`.classes`).
        size: image side in pixels (square images).
        seed: non-negative world seed.
        spurious: probability that the background type is tied to the main object's class; None for
            independent backgrounds (see the module docstring).
        num_backgrounds: number of background types used, at most ``len(BACKGROUND_NAMES)``.
        max_objects: scenes hold 1 to ``max_objects`` objects.
        num_instances_per_class: instances per class; ``instance_id = class_id * this + k``.

    Attributes:
        classes: public class descriptions (part and keypoint names).
        geometries: the class geometries behind them.
        background_names: names of the background types, indexed by ``Scene.background``.
    """

    MAIN_SCALE = (0.34, 0.48)  # bounding radius of the intended main object, fraction of the image side
    OTHER_SCALE = (0.2, 0.32)  # bounding radius of the other objects
    MAIN_SHIFT = 0.1  # the intended main object's centre is within this fraction of the image centre
    MAX_ANGLE = np.pi / 4  # rotations are uniform in [-MAX_ANGLE, MAX_ANGLE]
    MIN_MAIN_AREA = 0.15  # the largest visible object covers at least this fraction of the image
    COVERAGE_REF = 0.4  # classes covering less of their bounding disc are drawn larger (up to 1.2x), and
    SIZE_FACTOR = (0.85, 1.2)  # classes covering more are drawn smaller (down to 0.85x)
    PAIR_SCALE = (0.34, 0.44)
    PAIR_ANGLE_CHANGE = (0.25, 0.7)  # radians between the two poses of a pair
    VIDEO_SCALE = (0.25, 0.35)
    VIDEO_TRAVEL = (0.1, 0.25)  # distance between an object's first and last position, fraction of the side

    def __init__(
        self,
        num_classes: int = 10,
        size: int = 224,
        seed: int = 0,
        spurious: float | None = None,
        num_backgrounds: int = 5,
        max_objects: int = 3,
        num_instances_per_class: int = 20,
    ) -> None:
        if size < 16:
            raise VitscopeValueError(f"size must be >= 16 pixels, got {size}")
        if seed < 0:
            raise VitscopeValueError(f"seed must be a non-negative integer, got {seed}")
        if spurious is not None and not 0.0 <= spurious <= 1.0:
            raise VitscopeValueError(f"spurious must be None or a probability in [0, 1], got {spurious}")
        if not 1 <= num_backgrounds <= len(BACKGROUND_NAMES):
            raise VitscopeValueError(f"num_backgrounds must be in [1, {len(BACKGROUND_NAMES)}], got {num_backgrounds}")
        if max_objects < 1 or max_objects > 127:
            raise VitscopeValueError(f"max_objects must be in [1, 127], got {max_objects}")
        if num_instances_per_class < 1:
            raise VitscopeValueError(f"num_instances_per_class must be >= 1, got {num_instances_per_class}")
        self.num_classes = num_classes
        self.size = size
        self.seed = int(seed)
        self.spurious = spurious
        self.num_backgrounds = num_backgrounds
        self.max_objects = max_objects
        self.num_instances_per_class = num_instances_per_class
        self.geometries: list[ClassGeometry] = make_classes(num_classes)
        self.classes: list[ClassSpec] = [g.spec for g in self.geometries]
        self.background_names: list[str] = list(BACKGROUND_NAMES[:num_backgrounds])
        self._appearances: dict[int, Appearance] = {}
        lo, hi = self.SIZE_FACTOR
        self._size_factor = [float(np.clip(np.sqrt(self.COVERAGE_REF / g.coverage()), lo, hi)) for g in self.geometries]

    def __repr__(self) -> str:
        return (
            f"SyntheticWorld(num_classes={self.num_classes}, size={self.size}, seed={self.seed}, "
            f"spurious={self.spurious}, num_backgrounds={self.num_backgrounds}, max_objects={self.max_objects}, "
            f"num_instances_per_class={self.num_instances_per_class})"
        )

    # ----------------------------------------------------------------------------------------- helpers
    def _rng(self, index: int, salt: int) -> np.random.Generator:
        if index < 0:
            raise VitscopeValueError(f"index must be non-negative, got {index}")
        return np.random.default_rng([self.seed, int(index), salt])

    def instance_id(self, class_id: int, k: int) -> int:
        """Identity of instance ``k`` of class ``class_id``."""
        return class_id * self.num_instances_per_class + k

    def appearance(self, instance_id: int) -> Appearance:
        """Colours and pattern of an instance (cached; independent of the seed)."""
        app = self._appearances.get(instance_id)
        if app is None:
            class_id, k = divmod(instance_id, self.num_instances_per_class)
            geom = self.geometries[class_id]
            app = instance_appearance(class_id, k, len(geom.parts), geom.main_part())
            self._appearances[instance_id] = app
        return app

    def object_keypoints(self, class_id: int, pose: dict) -> np.ndarray:
        """``[K, 2]`` float32 image coordinates of class ``class_id``'s keypoints under ``pose``."""
        return object_keypoints(self.geometries[class_id], pose)

    def _random_object(self, rng: np.random.Generator, scale: tuple[float, float], shift: float | None) -> ObjectSpec:
        class_id = int(rng.integers(self.num_classes))
        k = int(rng.integers(self.num_instances_per_class))
        if shift is None:
            tx, ty = rng.uniform(0.1, 0.9, size=2) * self.size
        else:
            tx, ty = self.size * (0.5 + rng.uniform(-shift, shift, size=2))
        pose = {
            "tx": float(tx),
            "ty": float(ty),
            "scale": float(rng.uniform(*scale) * self.size * self._size_factor[class_id]),
            "angle": float(rng.uniform(-self.MAX_ANGLE, self.MAX_ANGLE)),
        }
        return ObjectSpec(class_id, self.instance_id(class_id, k), pose)

    def _background(self, rng: np.random.Generator, label: int) -> int:
        tie, free = rng.uniform(), int(rng.integers(self.num_backgrounds))
        if self.spurious is not None and tie < self.spurious:
            return label % self.num_backgrounds
        return free

    def _finish(
        self,
        rng: np.random.Generator,
        specs: Sequence[ObjectSpec],
        index: int,
        background: int | None = None,
        lay: Layout | None = None,
    ) -> Scene:
        if lay is None:
            lay = layout(specs, self.geometries, self.size)
        if background is None:
            background = self._background(rng, specs[main_object(lay)].class_id)
        pixels = background_image(background, self.size, rng)
        apps = [self.appearance(s.instance_id) for s in specs]
        return build_scene(lay, specs, self.geometries, apps, background, pixels, index)

    # ---------------------------------------------------------------------------------------- public API
    def scene(self, index: int) -> Scene:
        """Scene number ``index``: 1 to ``max_objects`` objects, the largest visible one setting the label.

        One object is drawn large near the centre (its class uniform) and the others smaller anywhere, in
        a random drawing order; the draw is repeated (from the same generator) until that object is the
        largest visible one and covers at least ``MIN_MAIN_AREA`` of the image, which keeps labels
        balanced and the main object substantial.
        """
        rng = self._rng(index, _SALT_SCENE)
        n = int(rng.integers(1, self.max_objects + 1))
        min_area = self.MIN_MAIN_AREA * self.size**2
        for _ in range(100):
            specs = [self._random_object(rng, self.MAIN_SCALE, self.MAIN_SHIFT)]
            specs += [self._random_object(rng, self.OTHER_SCALE, None) for _ in range(n - 1)]
            order = rng.permutation(n)
            specs = [specs[j] for j in order]
            lay = layout(specs, self.geometries, self.size)
            areas = lay.visible_areas()
            main = int(np.flatnonzero(order == 0)[0])
            if areas[main] >= min_area and int(np.argmax(areas)) == main:
                break
        return self._finish(rng, specs, index, lay=lay)

    def scenes(self, n: int, start: int = 0) -> Iterator[Scene]:
        """Scenes ``start`` to ``start + n - 1``."""
        for i in range(start, start + n):
            yield self.scene(i)

    def pair(self, index: int, same_instance: bool = True) -> tuple[Scene, Scene]:
        """Two single-object scenes of one instance (or two instances of one class) in different poses.

        Keypoint rows correspond (same class, same keypoint names). ``pair(i, False)`` shares its first
        image with ``pair(i, True)``.
        """
        if not same_instance and self.num_instances_per_class < 2:
            raise VitscopeValueError("pairs of different instances need num_instances_per_class >= 2")
        rng = self._rng(index, _SALT_PAIR)
        class_id = int(rng.integers(self.num_classes))
        k1 = int(rng.integers(self.num_instances_per_class))
        other = (k1 + int(rng.integers(1, max(self.num_instances_per_class, 2)))) % self.num_instances_per_class
        k2 = k1 if same_instance else other
        angle = rng.uniform(-self.MAX_ANGLE, self.MAX_ANGLE)
        angles = (angle, angle + rng.choice([-1.0, 1.0]) * rng.uniform(*self.PAIR_ANGLE_CHANGE))
        scenes = []
        for k, a in zip((k1, k2), angles):
            tx, ty = self.size * (0.5 + rng.uniform(-0.08, 0.08, size=2))
            pose = {
                "tx": float(tx),
                "ty": float(ty),
                "scale": float(rng.uniform(*self.PAIR_SCALE) * self.size),
                "angle": float(a),
            }
            scenes.append(self._finish(rng, [ObjectSpec(class_id, self.instance_id(class_id, k), pose)], index))
        return scenes[0], scenes[1]

    def video(self, index: int, num_frames: int = 8) -> list[Scene]:
        """A clip of 1 to 3 objects moving along smooth crossing paths over a fixed background.

        Each object starts in the central part of the image and follows a bent (quadratic Bezier) path
        while turning and growing slightly; objects are large, so they overlap and, the drawing order
        being fixed, occlude each other. The whole motion spans the clip, so more frames mean smaller
        steps. Every frame has ``index == index``.
        """
        if num_frames < 1:
            raise VitscopeValueError(f"num_frames must be >= 1, got {num_frames}")
        rng = self._rng(index, _SALT_VIDEO)
        n = int(rng.integers(1, min(3, self.max_objects) + 1))
        t = np.linspace(0.0, 1.0, num_frames) if num_frames > 1 else np.zeros(1)
        tracks = []
        for _ in range(n):
            obj = self._random_object(rng, self.VIDEO_SCALE, 0.0)
            start = rng.uniform(0.3, 0.7, size=2) * self.size
            theta = rng.uniform(0, 2 * np.pi)
            step = rng.uniform(*self.VIDEO_TRAVEL) * self.size * np.array([np.cos(theta), np.sin(theta)])
            bend = rng.uniform(-0.4, 0.4) * np.array([-step[1], step[0]])
            ctrl, end = start + step / 2 + bend, start + step
            path = ((1 - t) ** 2)[:, None] * start + (2 * t * (1 - t))[:, None] * ctrl + (t**2)[:, None] * end
            spin, growth = rng.uniform(-0.3, 0.3), rng.uniform(-0.1, 0.1)
            tracks.append((obj, path, spin, growth))
        frames_specs = [
            [
                ObjectSpec(
                    obj.class_id,
                    obj.instance_id,
                    {
                        "tx": float(path[f, 0]),
                        "ty": float(path[f, 1]),
                        "scale": float(obj.pose["scale"] * (1 + growth * t[f])),
                        "angle": float(obj.pose["angle"] + spin * t[f]),
                    },
                )
                for obj, path, spin, growth in tracks
            ]
            for f in range(num_frames)
        ]
        first = layout(frames_specs[0], self.geometries, self.size)
        background = self._background(rng, frames_specs[0][main_object(first)].class_id)
        pixels = background_image(background, self.size, rng)
        apps = [self.appearance(obj.instance_id) for obj, *_ in tracks]
        return [
            build_scene(
                layout(specs, self.geometries, self.size), specs, self.geometries, apps, background, pixels, index
            )
            for specs in frames_specs
        ]

    def render(self, objects: Sequence[ObjectSpec], background: int = 0, index: int = 0) -> Scene:
        """Draw explicit objects (back to front) over a background of type ``background``.

        A lower-level entry point for tests and custom data: poses, classes and instances are taken as
        given; ``index`` seeds the background texture's random parameters.
        """
        if not objects:
            raise VitscopeValueError("render needs at least one ObjectSpec")
        if not 0 <= background < self.num_backgrounds:
            raise VitscopeValueError(f"background must be in [0, {self.num_backgrounds}), got {background}")
        for spec in objects:
            if not 0 <= spec.class_id < self.num_classes:
                raise VitscopeValueError(f"class_id {spec.class_id} out of range [0, {self.num_classes})")
            if spec.instance_id // self.num_instances_per_class != spec.class_id:
                raise VitscopeValueError(f"instance_id {spec.instance_id} does not belong to class {spec.class_id}")
        return self._finish(self._rng(index, _SALT_RENDER), list(objects), index, background)


def _bench(size: int, n: int) -> None:
    world = SyntheticWorld(size=size)
    start = time.perf_counter()
    for _ in world.scenes(n):
        pass
    elapsed = time.perf_counter() - start
    print(f"{n} scenes at {size} px: {elapsed:.2f} s ({1000 * elapsed / n:.2f} ms/scene)")


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry: ``--bench`` times scene generation."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", action="store_true", help="time scene generation")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("-n", type=int, default=5000)
    args = parser.parse_args(argv)
    if not args.bench:
        parser.print_help()
        return
    _bench(args.size, args.n)


if __name__ == "__main__":
    main()
