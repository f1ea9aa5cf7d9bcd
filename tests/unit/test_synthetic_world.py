"""Tests of the procedural synthetic world (vitscope.data.synthetic)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vitscope.data.synthetic import ClassSpec, ObjectSpec, Scene, SceneObject, SyntheticWorld
from vitscope.data.synthetic.classes import keypoints_clear, make_classes
from vitscope.data.synthetic.render import box_of
from vitscope.data.synthetic.shapes import canonical_to_image
from vitscope.data.synthetic.textures import BACKGROUND_NAMES


@pytest.fixture(scope="module")
def world() -> SyntheticWorld:
    return SyntheticWorld(size=64, seed=3)


@pytest.fixture(scope="module")
def scenes(world: SyntheticWorld) -> list[Scene]:
    return list(world.scenes(60))


def _assert_same_scene(a: Scene, b: Scene) -> None:
    assert np.array_equal(a.image, b.image)
    assert (a.label, a.background, a.index, len(a.objects)) == (b.label, b.background, b.index, len(b.objects))
    for oa, ob in zip(a.objects, b.objects):
        assert (oa.class_id, oa.instance_id) == (ob.class_id, ob.instance_id)
        assert np.array_equal(oa.mask, ob.mask)
        assert np.array_equal(oa.part_masks, ob.part_masks)
        assert np.array_equal(oa.keypoints, ob.keypoints)
        assert np.array_equal(oa.box, ob.box)
        assert oa.pose == ob.pose


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    union = (a | b).sum()
    return 1.0 if union == 0 else float((a & b).sum() / union)


def _pose(tx: float, ty: float, scale: float, angle: float = 0.0) -> dict:
    return {"tx": tx, "ty": ty, "scale": scale, "angle": angle}


# ------------------------------------------------------------------------------------------ determinism
def test_same_seed_and_index_give_identical_scenes() -> None:
    a, b = SyntheticWorld(size=64, seed=3), SyntheticWorld(size=64, seed=3)
    for i in (0, 1, 17):
        _assert_same_scene(a.scene(i), b.scene(i))


def test_out_of_order_generation_gives_the_same_scene() -> None:
    a, b = SyntheticWorld(size=64, seed=3), SyntheticWorld(size=64, seed=3)
    forward = list(a.scenes(6))
    backward = [b.scene(i) for i in reversed(range(6))][::-1]
    for x, y in zip(forward, backward):
        _assert_same_scene(x, y)
    _assert_same_scene(list(a.scenes(2, start=4))[1], forward[5])


def test_different_index_or_seed_gives_different_scenes() -> None:
    w = SyntheticWorld(size=64, seed=3)
    assert not np.array_equal(w.scene(0).image, w.scene(1).image)
    assert not np.array_equal(w.scene(0).image, SyntheticWorld(size=64, seed=4).scene(0).image)


def test_pairs_and_videos_are_deterministic() -> None:
    a, b = SyntheticWorld(size=48, seed=1), SyntheticWorld(size=48, seed=1)
    for x, y in zip(a.pair(5, same_instance=False), b.pair(5, same_instance=False)):
        _assert_same_scene(x, y)
    for x, y in zip(a.video(2, num_frames=4), b.video(2, num_frames=4)):
        _assert_same_scene(x, y)


# ----------------------------------------------------------------------------------- shapes and masks
@pytest.mark.parametrize("size", [48, 64])
def test_shapes_and_dtypes(size: int) -> None:
    w = SyntheticWorld(num_classes=12, size=size, seed=0, max_objects=4)
    for s in w.scenes(20):
        assert isinstance(s, Scene)
        assert s.image.shape == (size, size, 3) and s.image.dtype == np.uint8
        assert 1 <= len(s.objects) <= 4
        assert 0 <= s.background < w.num_backgrounds and 0 <= s.label < 12
        for o in s.objects:
            assert isinstance(o, SceneObject)
            spec = w.classes[o.class_id]
            assert o.mask.shape == (size, size) and o.mask.dtype == bool
            assert o.part_masks.shape == (len(spec.part_names), size, size) and o.part_masks.dtype == bool
            assert o.box.shape == (4,) and o.box.dtype == np.float32
            assert o.keypoints.shape == (len(spec.keypoint_names), 3) and o.keypoints.dtype == np.float32
            assert set(np.unique(o.keypoints[:, 2])) <= {0.0, 1.0}
            assert o.instance_id // w.num_instances_per_class == o.class_id
            assert set(o.pose) == {"tx", "ty", "scale", "angle"}


def test_parts_partition_the_object_mask(scenes: list[Scene]) -> None:
    for s in scenes:
        for o in s.objects:
            assert np.array_equal(o.part_masks.any(axis=0), o.mask)
            assert o.part_masks.sum(axis=0).max() <= 1


def test_objects_are_disjoint_and_box_tightly_bounds_mask(scenes: list[Scene]) -> None:
    for s in scenes:
        coverage = np.sum([o.mask for o in s.objects], axis=0)
        assert coverage.max() <= 1
        for o in s.objects:
            if not o.mask.any():
                assert np.all(o.box == 0)
                continue
            rows, cols = np.nonzero(o.mask)
            assert o.box.tolist() == [cols.min(), rows.min(), cols.max() + 1, rows.max() + 1]


def test_box_of_empty_and_single_pixel() -> None:
    m = np.zeros((5, 7), dtype=bool)
    assert box_of(m).tolist() == [0, 0, 0, 0]
    m[2, 3] = True
    assert box_of(m).tolist() == [3, 2, 4, 3]


def test_masks_are_visible_regions_under_occlusion(world: SyntheticWorld) -> None:
    back = ObjectSpec(3, world.instance_id(3, 0), _pose(28, 32, 24))
    front = ObjectSpec(2, world.instance_id(2, 1), _pose(40, 36, 18, 0.3))
    alone_back = world.render([back]).objects[0].mask
    alone_front = world.render([front]).objects[0].mask
    both = world.render([back, front])
    overlap = alone_back & alone_front
    assert overlap.sum() > 20  # the test needs a real overlap
    assert np.array_equal(both.objects[0].mask, alone_back & ~alone_front)
    assert np.array_equal(both.objects[1].mask, alone_front)
    assert np.array_equal(both.objects[1].part_masks, world.render([front]).objects[0].part_masks)


def test_fully_occluded_object_has_empty_mask_zero_box_and_invisible_keypoints(world: SyntheticWorld) -> None:
    cover = ObjectSpec(3, world.instance_id(3, 0), _pose(32, 32, 30))  # a house: its wall is a big block
    body = world.geometries[3].parts[0]
    assert body.name == "body"
    x, y = canonical_to_image(np.array([body.center]), cover.pose)[0]
    hidden = ObjectSpec(0, 0, _pose(float(x), float(y), 5))
    s = world.render([hidden, cover])
    o = s.objects[0]
    assert not o.mask.any() and not o.part_masks.any()
    assert np.all(o.box == 0)
    assert np.all(o.keypoints[:, 2] == 0)
    assert np.allclose(o.keypoints[:, :2], world.object_keypoints(0, hidden.pose))
    assert s.label == 3


def test_label_is_class_of_largest_visible_object_and_main_is_substantial(scenes: list[Scene]) -> None:
    for s in scenes:
        areas = [o.mask.sum() for o in s.objects]
        assert s.label == s.objects[int(np.argmax(areas))].class_id
        assert max(areas) >= SyntheticWorld.MIN_MAIN_AREA * 64 * 64


def test_labels_are_roughly_balanced() -> None:
    w = SyntheticWorld(num_classes=5, size=48, seed=0)
    counts = np.bincount([s.label for s in w.scenes(300)], minlength=5)
    assert counts.min() >= 30, counts


def test_scenes_contain_occlusion_and_several_objects(scenes: list[Scene]) -> None:
    assert any(len(s.objects) > 1 for s in scenes)
    assert any(len(s.objects) == 1 for s in scenes)


# ------------------------------------------------------------------------------------------ keypoints
def test_visible_keypoints_lie_on_their_part(world: SyntheticWorld, scenes: list[Scene]) -> None:
    checked = 0
    for s in scenes:
        for o in s.objects:
            geom = world.geometries[o.class_id]
            for (x, y, v), kp in zip(o.keypoints, geom.keypoints):
                if v:
                    assert o.part_masks[kp.part, int(y), int(x)]
                    checked += 1
    assert checked > 100


@pytest.mark.parametrize("size", [64, 224])
def test_unoccluded_objects_inside_the_image_have_all_keypoints_visible(size: int) -> None:
    w = SyntheticWorld(num_classes=16, size=size)
    rng = np.random.default_rng(0)
    for c in range(16):
        for angle in rng.uniform(-np.pi, np.pi, size=4):
            pose = _pose(size / 2, size / 2, size * rng.uniform(0.3, 0.48), angle)
            o = w.render([ObjectSpec(c, w.instance_id(c, 0), pose)]).objects[0]
            assert np.all(o.keypoints[:, 2] == 1), (w.classes[c].name, pose)


def test_keypoints_and_masks_follow_translation() -> None:
    w = SyntheticWorld(size=64)
    pose = _pose(30.3, 29.6, 20.0, 0.4)
    moved = dict(pose, tx=pose["tx"] + 5, ty=pose["ty"] - 3)
    a = w.render([ObjectSpec(1, w.instance_id(1, 0), pose)]).objects[0]
    b = w.render([ObjectSpec(1, w.instance_id(1, 0), moved)]).objects[0]
    assert np.allclose(b.keypoints[:, :2], a.keypoints[:, :2] + np.array([5, -3]), atol=1e-4)
    assert np.array_equal(b.part_masks, np.roll(a.part_masks, (-3, 5), axis=(1, 2)))


def test_keypoints_and_masks_follow_rotation() -> None:
    """A quarter turn about the image centre maps pixel centres onto pixel centres: masks rotate exactly."""
    w = SyntheticWorld(size=64)
    pose = _pose(32.0, 32.0, 26.0, 0.3)
    turned = dict(pose, angle=pose["angle"] + np.pi / 2)  # clockwise on screen (y points down)
    for c in (0, 2, 9):
        a = w.render([ObjectSpec(c, w.instance_id(c, 0), pose)]).objects[0]
        b = w.render([ObjectSpec(c, w.instance_id(c, 0), turned)]).objects[0]
        rotated = np.rot90(a.part_masks, k=-1, axes=(1, 2))  # clockwise
        assert (rotated != b.part_masks).mean() < 0.002
        rel = a.keypoints[:, :2] - 32.0
        expected = np.stack([-rel[:, 1], rel[:, 0]], axis=1) + 32.0
        assert np.allclose(b.keypoints[:, :2], expected, atol=1e-3)


def test_keypoints_scale_with_pose() -> None:
    w = SyntheticWorld(size=64)
    small = w.object_keypoints(4, _pose(32, 32, 10, 0.2))
    big = w.object_keypoints(4, _pose(32, 32, 20, 0.2))
    assert np.allclose(big - 32, 2 * (small - 32), atol=1e-4)


def test_covered_keypoint_is_invisible_but_still_reported(world: SyntheticWorld) -> None:
    pose = _pose(32, 32, 24)
    kps = world.object_keypoints(0, pose)  # fish: keypoint 0 is the nose
    alone = world.render([ObjectSpec(0, 0, pose)]).objects[0]
    assert alone.keypoints[0, 2] == 1
    cover = ObjectSpec(5, world.instance_id(5, 0), _pose(float(kps[0, 0]), float(kps[0, 1]), 8))
    covered = world.render([ObjectSpec(0, 0, pose), cover]).objects[0]
    assert covered.keypoints[0, 2] == 0
    assert np.allclose(covered.keypoints[:, :2], kps)
    assert np.all(covered.keypoints[1:, 2] == alone.keypoints[1:, 2])


def test_keypoints_outside_the_image_are_invisible(world: SyntheticWorld) -> None:
    o = world.render([ObjectSpec(0, 0, _pose(2, 32, 24))]).objects[0]  # the fish's tail sticks out left
    outside = o.keypoints[:, 0] < 0
    assert outside.any()
    assert np.all(o.keypoints[outside, 2] == 0)


# ---------------------------------------------------------------------------------------------- classes
def test_classes_depend_only_on_num_classes() -> None:
    a = SyntheticWorld(num_classes=10, seed=0, size=32).classes
    b = SyntheticWorld(num_classes=10, seed=9, size=32).classes
    c = SyntheticWorld(num_classes=40, seed=2, size=32).classes
    assert a == b == c[:10]
    for i, spec in enumerate(c):
        assert isinstance(spec, ClassSpec)
        assert spec.name.startswith(f"class{i:02d}-")
        assert 2 <= len(spec.part_names) <= 4 and 3 <= len(spec.keypoint_names) <= 6
        assert len(set(spec.part_names)) == len(spec.part_names)
        assert len(set(spec.keypoint_names)) == len(spec.keypoint_names)
    assert len({s.name for s in c}) == 40


def test_canonical_keypoints_sit_clear_inside_their_parts() -> None:
    for g in make_classes(48):
        assert keypoints_clear(g), g.name
        assert abs(g.radius() - 1.0) < 1e-9


# ------------------------------------------------------------------------------------ spurious backgrounds
def test_spurious_one_ties_background_to_label() -> None:
    w = SyntheticWorld(size=32, seed=0, spurious=1.0, num_backgrounds=4)
    for s in w.scenes(200):
        assert s.background == s.label % 4


def test_independent_backgrounds_cover_every_type() -> None:
    w = SyntheticWorld(size=32, seed=0, num_backgrounds=5)
    counts = np.bincount([s.background for s in w.scenes(200)], minlength=5)
    assert np.all(counts > 0) and counts.max() < 80, counts
    assert w.background_names == list(BACKGROUND_NAMES[:5])


def test_partial_spurious_rate_and_same_objects() -> None:
    base = SyntheticWorld(size=32, seed=0, num_backgrounds=5)
    half = SyntheticWorld(size=32, seed=0, num_backgrounds=5, spurious=0.5)
    agree = 0
    for a, b in zip(base.scenes(300), half.scenes(300)):
        assert a.label == b.label and np.array_equal(a.objects[0].mask, b.objects[0].mask)
        agree += b.background == b.label % 5
    assert 0.5 < agree / 300 < 0.7  # expected 0.5 + 0.5 / 5 = 0.6


def test_background_types_differ() -> None:
    w = SyntheticWorld(size=64, num_backgrounds=len(BACKGROUND_NAMES))
    spec = ObjectSpec(0, 0, _pose(-100, -100, 5))  # off-image: the image is pure background
    images = [w.render([spec], background=b, index=0).image.astype(float) for b in range(w.num_backgrounds)]
    for i in range(len(images)):
        assert images[i].std() > 1.0
        for j in range(i):
            assert np.abs(images[i] - images[j]).mean() > 1.0


# ------------------------------------------------------------------------------------------------ pairs
def test_pairs_same_instance(world: SyntheticWorld) -> None:
    for i in range(10):
        a, b = world.pair(i, same_instance=True)
        oa, ob = a.objects[0], b.objects[0]
        assert len(a.objects) == len(b.objects) == 1
        assert oa.instance_id == ob.instance_id and a.label == b.label == oa.class_id
        assert oa.keypoints.shape == ob.keypoints.shape
        assert abs(oa.pose["angle"] - ob.pose["angle"]) >= SyntheticWorld.PAIR_ANGLE_CHANGE[0] - 1e-9
        assert not np.allclose(oa.keypoints[:, :2], ob.keypoints[:, :2])
        # rows correspond: mapped back through each pose, both land on the same canonical points
        canon = []
        for o in (oa, ob):
            p = o.pose
            rel = (o.keypoints[:, :2] - [p["tx"], p["ty"]]) / p["scale"]
            c, s = np.cos(p["angle"]), np.sin(p["angle"])
            canon.append(rel @ np.array([[c, -s], [s, c]]))
        assert np.allclose(canon[0], canon[1], atol=1e-4)


def test_pairs_different_instance_same_class(world: SyntheticWorld) -> None:
    for i in range(10):
        a, b = world.pair(i, same_instance=False)
        oa, ob = a.objects[0], b.objects[0]
        assert oa.class_id == ob.class_id and oa.instance_id != ob.instance_id
        _assert_same_scene(a, world.pair(i, same_instance=True)[0])
    with pytest.raises(ValueError, match="num_instances_per_class"):
        SyntheticWorld(size=32, num_instances_per_class=1).pair(0, same_instance=False)


def _colours(scene: Scene) -> set[tuple[int, ...]]:
    return {tuple(c) for c in scene.image[scene.objects[0].mask]}


def test_instance_appearance_is_stable_and_distinct() -> None:
    w = SyntheticWorld(size=96, seed=0)
    same = [_colours(s) for s in w.pair(3, same_instance=True)]
    diff = [_colours(s) for s in w.pair(3, same_instance=False)]
    assert len(same[0] & same[1]) / len(same[0] | same[1]) > 0.7
    assert len(diff[0] & diff[1]) / len(diff[0] | diff[1]) < 0.3
    other = SyntheticWorld(size=32, seed=7)
    assert np.array_equal(w.appearance(57).colours, other.appearance(57).colours)


# ----------------------------------------------------------------------------------------------- videos
def test_videos_keep_identity_move_smoothly_and_occlude() -> None:
    w = SyntheticWorld(size=64, seed=0)
    occluded_frames, ious_all = 0, []
    for i in range(12):
        frames = w.video(i, num_frames=8)
        assert len(frames) == 8 and all(f.index == i for f in frames)
        ids = [[o.instance_id for o in f.objects] for f in frames]
        assert all(x == ids[0] for x in ids) and 1 <= len(ids[0]) <= 3
        assert all(f.background == frames[0].background for f in frames)
        for j in range(len(ids[0])):
            ious = [_iou(frames[t].objects[j].mask, frames[t + 1].objects[j].mask) for t in range(7)]
            ious_all += ious
            if j == len(ids[0]) - 1:  # drawn last: never occluded, so its mask only moves
                assert min(ious) > 0.5, ious
        for f in frames:
            for o in f.objects[:-1]:
                full = w.render([ObjectSpec(o.class_id, o.instance_id, o.pose)]).objects[0].mask
                occluded_frames += int(full.sum() > o.mask.sum())
    assert np.median(ious_all) > 0.65
    assert occluded_frames > 0


def test_video_arguments() -> None:
    w = SyntheticWorld(size=32)
    assert len(w.video(0, num_frames=1)) == 1
    with pytest.raises(ValueError, match="num_frames"):
        w.video(0, num_frames=0)


# ------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "kwargs",
    [
        {"spurious": 1.5},
        {"num_backgrounds": len(BACKGROUND_NAMES) + 1},
        {"num_backgrounds": 0},
        {"size": 8},
        {"seed": -1},
        {"max_objects": 0},
        {"num_classes": 0},
        {"num_instances_per_class": 0},
    ],
)
def test_bad_arguments_are_rejected(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        SyntheticWorld(**kwargs)


def test_render_rejects_bad_specs(world: SyntheticWorld) -> None:
    with pytest.raises(ValueError, match="background"):
        world.render([ObjectSpec(0, 0, _pose(32, 32, 10))], background=99)
    with pytest.raises(ValueError, match="instance_id"):
        world.render([ObjectSpec(1, 0, _pose(32, 32, 10))])
    with pytest.raises(ValueError, match="index"):
        world.scene(-1)


def test_the_written_coco_world_says_each_images_background(tmp_path) -> None:
    """The shortcut's ground truth travels with the data: every image's background type, the scene's own."""
    from vitscope.data import load_dataset
    from vitscope.data.synthetic.write import synthesize

    world = SyntheticWorld(seed=3, size=32, spurious=1.0)
    for fmt in ("coco", "partimagenet", "imagenet-boxes"):
        root = synthesize(tmp_path / fmt, fmt, n=6, size=32, seed=3, spurious=1.0)
        dataset = load_dataset(str(root), fmt)
        for i in range(len(dataset)):
            scene = world.scene(int(Path(dataset[i].image_path).stem.rsplit("_", 1)[-1])) if fmt == "imagenet-boxes" \
                else world.scene(i)  # ImageNet's layout orders the images by class
            assert dataset[i].meta["background"] == scene.background == scene.label % world.num_backgrounds, fmt
