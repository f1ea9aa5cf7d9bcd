"""Round trips, hand-written real-layout fixtures and bad inputs for the COCO-family format readers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitscope.data.formats.coco import CocoDataset
from vitscope.data.formats.coco_writer import mask_to_polygons, write_coco
from vitscope.data.formats.common import (
    DatasetFileNotFoundError,
    DatasetFormatError,
    mask_to_box,
    read_json,
    safe_join,
    save_jpeg,
    save_png,
)
from vitscope.data.formats.imagefolder import ImageFolderDataset, write_imagefolder
from vitscope.data.formats.imagenet_boxes import ImageNetBoxesDataset, write_imagenet_boxes
from vitscope.data.formats.partimagenet import PartImageNetDataset, write_partimagenet
from vitscope.data.images import ImageLoadError
from vitscope.data.synthetic.scene import ClassSpec, Scene, SceneObject

CLASSES = [ClassSpec("Bird", ("head", "body"), ()), ClassSpec("Car", ("body", "wheel"), ())]
NAMES = [c.name for c in CLASSES]  # sorted, so folder order == class order
H, W = 40, 56


def _rect(r0: int, r1: int, c0: int, c1: int) -> np.ndarray:
    m = np.zeros((H, W), bool)
    m[r0:r1, c0:c1] = True
    return m


def _ellipse(cy: float, cx: float, ry: float, rx: float) -> np.ndarray:
    yy, xx = np.mgrid[:H, :W]
    return ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1


def make_scene(index: int) -> Scene:
    """Bird ellipse, then a Car rectangle over it, then a small Bird inside the Car (a hole in the Car).

    Odd indices get a big Car, so the label alternates. Masks are visible masks after occlusion.
    """
    s = index % 3
    car = _rect(4, 36, 28, 54) if index % 2 else _rect(8 + s, 30, 30, 50)
    drawn = [  # (class_id, full mask, split row between part 0 and part 1)
        (0, _ellipse(20, 16 + s, 12, 14), 14),
        (1, car, 24),
        (0, _rect(14, 18, 38, 42), 16),
    ]
    rng = np.random.default_rng(index)
    image = rng.integers(0, 256, size=(H, W, 3), dtype=np.uint8)
    objects = []
    for k, (cid, full, split) in enumerate(drawn):
        visible = full.copy()
        for _, later, _ in drawn[k + 1 :]:
            visible &= ~later
        top = np.zeros((H, W), bool)
        top[:split] = True
        parts = np.stack([visible & top, visible & ~top])
        image[visible] = (60 * (k + 1), 40 * cid, 200)
        objects.append(SceneObject(cid, 100 + k, visible, parts, mask_to_box(visible), np.zeros((0, 3), np.float32)))
    label = max(objects, key=lambda o: o.mask.sum()).class_id
    return Scene(image=image, background=0, objects=objects, label=label, index=index)


@pytest.fixture(scope="module")
def scenes() -> list[Scene]:
    return [make_scene(i) for i in range(4)]


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum() / (a | b).sum())


def _one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg
    return msg


# ----------------------------------------------------------------------------------------------- common


def test_common_helpers(tmp_path: Path) -> None:
    assert safe_join(tmp_path, "a/./b.jpg", "e") == tmp_path / "a" / "b.jpg"
    for bad in ("../../etc/passwd", "/etc/passwd", "a/../../x", "C:\\x.jpg", "", None):
        with pytest.raises(DatasetFormatError, match="entry 7"):
            safe_join(tmp_path, bad, "entry 7")
    mask = np.zeros((5, 6), bool)
    np.testing.assert_array_equal(mask_to_box(mask), np.zeros(4, np.float32))
    mask[1:3, 2:5] = True
    box = mask_to_box(mask)
    assert box.dtype == np.float32 and box.tolist() == [2, 1, 5, 3]
    bad = tmp_path / "bad.json"
    bad.write_text('{"images": [', encoding="utf-8")
    with pytest.raises(DatasetFormatError) as err:
        read_json(bad)
    assert "bad.json" in _one_line(err)
    with pytest.raises(DatasetFileNotFoundError, match="nothere.json"):
        read_json(tmp_path / "nothere.json")
    img = np.arange(12 * 3, dtype=np.uint8).reshape(2, 6, 3)
    np.testing.assert_array_equal(np.asarray(Image.open(save_png(img, tmp_path / "x" / "a.png"))), img)
    assert Image.open(save_jpeg(img, tmp_path / "x" / "a.jpg")).size == (6, 2)
    with pytest.raises(ValueError, match="uint8"):
        save_png(img.astype(np.float32), tmp_path / "f.png")


# ------------------------------------------------------------------------------------------ imagefolder


def test_imagefolder_round_trip(tmp_path: Path, scenes: list[Scene]) -> None:
    paths = write_imagefolder(scenes, tmp_path, NAMES)
    assert paths[1] == tmp_path / NAMES[scenes[1].label] / "000001.png"
    ds = ImageFolderDataset(tmp_path)
    assert ds.classes == NAMES and len(ds) == len(scenes)
    by_path = {str(p): s for p, s in zip(paths, scenes)}
    for i, item in enumerate(ds):
        scene = by_path[item.image_path]
        assert item.label == scene.label and item.meta["class_name"] == NAMES[scene.label]
        np.testing.assert_array_equal(np.asarray(ds.load_image(i)), scene.image)  # PNG is lossless
    assert ds[-1].image_path == ds[len(ds) - 1].image_path
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_imagefolder_reads_sub_folders_of_a_class_and_linked_folders(tmp_path: Path) -> None:
    """As torchvision's ImageFolder: a class folder is walked whole (links to folders followed), hidden names
    skipped, in its order within a class (folder path as a string, then file name)."""
    import os

    root = tmp_path / "root"
    for rel in ("cat/z.png", "cat/sub/a.png", "cat/sub/deeper/b.jpg", "cat/.hidden/c.png", "dog/d.png",
                "elsewhere/e.png"):
        (tmp_path / ("" if rel.startswith("elsewhere") else "root") / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / ("" if rel.startswith("elsewhere") else "root") / rel).write_bytes(b"x")
    os.symlink(tmp_path / "elsewhere", root / "dog" / "linked")
    os.symlink(root / "cat", root / "cat" / "sub" / "loop")  # a link loop ends
    ds = ImageFolderDataset(root)
    assert [(Path(p).relative_to(root).as_posix(), label) for p, label in ds.samples] == [
        ("cat/z.png", 0), ("cat/sub/a.png", 0), ("cat/sub/deeper/b.jpg", 0), ("dog/d.png", 1),
        ("dog/linked/e.png", 1)]


def test_imagefolder_lazy_and_missing(tmp_path: Path) -> None:
    for cls in ("b", "a"):
        (tmp_path / cls).mkdir()
        (tmp_path / cls / "0.jpg").write_bytes(b"")  # corrupt: constructing must not decode
    ds = ImageFolderDataset(tmp_path)
    assert ds.classes == ["a", "b"] and [it.label for it in ds] == [0, 1]
    with pytest.raises(ImageLoadError, match="0.jpg"):
        ds.load_image(0)
    (tmp_path / "a" / "0.jpg").unlink()
    with pytest.raises(DatasetFileNotFoundError) as err:
        ds[0]
    assert "0.jpg" in _one_line(err)
    with pytest.raises(DatasetFileNotFoundError):
        ImageFolderDataset(tmp_path / "nope")


# --------------------------------------------------------------------------------------- imagenet boxes


def test_imagenet_boxes_round_trip(tmp_path: Path, scenes: list[Scene]) -> None:
    write_imagenet_boxes(scenes, tmp_path, NAMES, split="train", wnids=["n02", "n01"])
    ds = ImageNetBoxesDataset(tmp_path, "train")
    assert ds.wnids == ["n02", "n01"] and ds.classes == NAMES and len(ds) == 4
    for item in ds:
        scene = scenes[int(Path(item.image_path).stem.split("_")[1])]
        assert item.label == scene.label and item.meta["wnid"] == ["n02", "n01"][scene.label]
        np.testing.assert_array_equal(item.boxes, np.stack([o.box for o in scene.objects]))
        np.testing.assert_array_equal(item.instance_labels, [o.class_id for o in scene.objects])
    assert ds[-4].image_path == ds[0].image_path


VOC_XML = """<annotation>
    <folder>n01440764</folder>
    <filename>n01440764_18</filename>
    <source><database>ILSVRC_2012</database></source>
    <size><width>25</width><height>20</height><depth>3</depth></size>
    <segmented>0</segmented>
    <object>
        <name>n01440764</name><pose>Unspecified</pose><truncated>0</truncated><difficult>0</difficult>
        <bndbox><xmin>1</xmin><ymin>3</ymin><xmax>10</xmax><ymax>20</ymax></bndbox>
    </object>
    <object>
        <name>n01443537</name><pose>Unspecified</pose><truncated>0</truncated><difficult>0</difficult>
        <bndbox><xmin>12</xmin><ymin>1</ymin><xmax>25</xmax><ymax>5</ymax></bndbox>
    </object>
</annotation>
"""


def test_imagenet_boxes_hand_written_voc(tmp_path: Path) -> None:
    (tmp_path / "LOC_synset_mapping.txt").write_text(
        "n01440764 tench, Tinca tinca\nn01443537 goldfish, Carassius auratus\n", encoding="utf-8"
    )
    for name in ("n01440764_18", "n01440764_29"):
        save_jpeg(np.zeros((20, 25, 3), np.uint8), tmp_path / "train" / "n01440764" / f"{name}.JPEG")
    (tmp_path / "boxes" / "n01440764").mkdir(parents=True)
    (tmp_path / "boxes" / "n01440764" / "n01440764_18.xml").write_text(VOC_XML, encoding="utf-8")
    ds = ImageNetBoxesDataset(tmp_path)
    assert ds.classes == ["tench, Tinca tinca", "goldfish, Carassius auratus"]
    item = ds[0]
    assert item.label == 0
    # 1-based inclusive VOC (xmin=1..xmax=10) -> 0-based exclusive [0, 10)
    np.testing.assert_array_equal(item.boxes, np.array([[0, 2, 10, 20], [11, 0, 25, 5]], np.float32))
    np.testing.assert_array_equal(item.instance_labels, [0, 1])
    assert ds[1].boxes.shape == (0, 4) and ds[1].meta["box_file"] is None  # no XML: no boxes
    (tmp_path / "boxes" / "n01440764" / "n01440764_18.xml").write_text("<annotation><object>", encoding="utf-8")
    with pytest.raises(DatasetFormatError) as err:
        ds[0]
    assert "n01440764_18.xml" in _one_line(err)


# ------------------------------------------------------------------------------------------------ COCO


@pytest.mark.parametrize("use_rle", [True, False])
def test_coco_round_trip(tmp_path: Path, scenes: list[Scene], use_rle: bool) -> None:
    ann = write_coco(scenes, tmp_path, NAMES, split="val2017", use_rle=use_rle)
    assert ann == tmp_path / "annotations" / "instances_val2017.json"
    assert (tmp_path / "val2017" / "000000000003.jpg").is_file()
    ds = CocoDataset(tmp_path, "val2017")
    assert len(ds) == len(scenes) and ds.classes == NAMES and ds.category_ids == [1, 2]
    for scene, item in zip(scenes, ds):
        assert item.meta["image_id"] == scene.index + 1 and item.label == scene.label
        assert item.masks.shape == (3, H, W) and item.masks.dtype == bool
        np.testing.assert_array_equal(item.instance_labels, [o.class_id for o in scene.objects])
        np.testing.assert_array_equal(item.boxes, np.stack([o.box for o in scene.objects]))
        for got, obj in zip(item.masks, scene.objects):
            if use_rle:
                np.testing.assert_array_equal(got, obj.mask)
            else:  # polygons: filled outlines, the Car's hole is lost
                assert _iou(got, obj.mask) > 0.9
    assert ds[-1].meta["image_id"] == ds[3].meta["image_id"]


@pytest.mark.filterwarnings("ignore:.*__array__ implementation:DeprecationWarning")  # pycocotools vs numpy 2
def test_polygons_of_simple_masks_are_exact() -> None:
    from pycocotools import mask as mask_utils

    scene = make_scene(0)
    for obj in scene.objects[:1] + scene.objects[2:]:  # no holes
        rle = mask_utils.merge(mask_utils.frPyObjects(mask_to_polygons(obj.mask), H, W))
        np.testing.assert_array_equal(mask_utils.decode(rle).astype(bool), obj.mask)


COCO_FIXTURE = {
    "info": {"description": "hand-written"},
    "images": [{"id": 42, "file_name": "000000000042.png", "width": 5, "height": 4, "license": 1}],
    "annotations": [
        {
            "id": 7,
            "image_id": 42,
            "category_id": 18,
            "iscrowd": 0,
            "area": 6.0,
            "bbox": [1, 1, 3, 2],
            "segmentation": [[1, 1, 4, 1, 4, 3, 1, 3]],
        },
        {
            "id": 8,
            "image_id": 42,
            "category_id": 3,
            "iscrowd": 1,
            "area": 4.0,
            "bbox": [4, 0, 1, 4],
            "segmentation": {"size": [4, 5], "counts": [16, 4]},
        },  # column-major: the last column
    ],
    "categories": [
        {"id": 18, "name": "dog", "supercategory": "animal"},
        {"id": 3, "name": "car", "supercategory": "vehicle"},
    ],
}


def _write_coco_fixture(root: Path, data: dict, image: bytes | None = None) -> None:
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    (root / "annotations" / "instances_val2017.json").write_text(json.dumps(data), encoding="utf-8")
    (root / "val2017").mkdir(exist_ok=True)
    if image is None:
        save_png(np.full((4, 5, 3), 128, np.uint8), root / "val2017" / "000000000042.png")
    else:
        (root / "val2017" / "000000000042.png").write_bytes(image)


def test_coco_hand_written_fixture(tmp_path: Path) -> None:
    _write_coco_fixture(tmp_path, COCO_FIXTURE)
    ds = CocoDataset(tmp_path)
    assert ds.classes == ["car", "dog"] and ds.category_ids == [3, 18]  # sorted by id
    item = ds[0]
    expected = np.zeros((2, 4, 5), bool)
    expected[0, 1:3, 1:4] = True
    expected[1, :, 4] = True
    np.testing.assert_array_equal(item.masks, expected)
    np.testing.assert_array_equal(item.instance_labels, [1, 0])
    np.testing.assert_array_equal(item.boxes, np.array([[1, 1, 4, 3], [4, 0, 5, 4]], np.float32))
    assert item.label == 1  # the largest (and the only non-crowd) annotation: dog
    assert item.meta["image_id"] == 42 and item.meta["category_ids"] == [18, 3]
    np.testing.assert_array_equal(item.meta["iscrowd"], [0, 1])
    assert ds.load_image(-1).size == (5, 4)


def test_coco_bad_inputs(tmp_path: Path) -> None:
    _write_coco_fixture(tmp_path, COCO_FIXTURE)
    ann = tmp_path / "annotations" / "instances_val2017.json"
    ann.write_text(json.dumps(COCO_FIXTURE)[:-5], encoding="utf-8")
    with pytest.raises(DatasetFormatError) as err:
        CocoDataset(tmp_path)
    assert "instances_val2017.json" in _one_line(err)

    evil = json.loads(json.dumps(COCO_FIXTURE))
    evil["images"][0]["file_name"] = "../../etc/passwd"
    ann.write_text(json.dumps(evil), encoding="utf-8")
    with pytest.raises(DatasetFormatError) as err:
        CocoDataset(tmp_path)
    assert "../../etc/passwd" in _one_line(err) and "id 42" in str(err.value)

    bad_rle = json.loads(json.dumps(COCO_FIXTURE))
    bad_rle["annotations"][1]["segmentation"]["counts"] = [16, 40]  # runs overflow the image
    ann.write_text(json.dumps(bad_rle), encoding="utf-8")
    with pytest.raises(DatasetFormatError, match="annotation id 8"):
        CocoDataset(tmp_path)[0]

    missing = json.loads(json.dumps(COCO_FIXTURE))
    missing["images"][0]["file_name"] = "gone.jpg"
    ann.write_text(json.dumps(missing), encoding="utf-8")
    ds = CocoDataset(tmp_path)  # existence is checked on access
    with pytest.raises(DatasetFileNotFoundError) as err:
        ds[-1]
    assert "gone.jpg" in _one_line(err) and "id 42" in str(err.value)


def test_coco_is_lazy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write_coco_fixture(tmp_path, COCO_FIXTURE, image=b"")  # a 0-byte image
    import PIL.Image

    def no_decoding(*args, **kwargs):
        raise AssertionError("an image was decoded")

    monkeypatch.setattr(PIL.Image, "open", no_decoding)
    ds = CocoDataset(tmp_path)
    assert len(ds) == 1 and ds[0].masks.shape == (2, 4, 5)  # annotations need no pixels
    monkeypatch.undo()
    with pytest.raises(ImageLoadError, match="000000000042.png"):
        ds.load_image(0)


# ---------------------------------------------------------------------------------------- PartImageNet


def test_partimagenet_round_trip(tmp_path: Path, scenes: list[Scene]) -> None:
    ann = write_partimagenet(scenes, tmp_path, CLASSES, split="train", use_rle=True, image_format="png")
    assert ann == tmp_path / "annotations" / "train.json"
    cats = read_json(ann)["categories"]
    assert cats[0] == {"id": 0, "name": "Bird head", "supercategory": "Bird"}
    ds = PartImageNetDataset(tmp_path, "train")
    assert ds.classes == NAMES and ds.part_names == ["Bird head", "Bird body", "Car body", "Car wheel"]
    assert len(ds) == 4 and ds[-1].image_path.endswith("images/train/00000003.png")
    for scene, item in zip(scenes, ds):
        parts = [(o.class_id * 2 + p, m) for o in scene.objects for p, m in enumerate(o.part_masks) if m.any()]
        np.testing.assert_array_equal(item.instance_labels, [p for p, _ in parts])
        np.testing.assert_array_equal(item.masks, np.stack([m for _, m in parts]))
        np.testing.assert_array_equal(item.boxes, np.stack([mask_to_box(m) for _, m in parts]))
        assert item.label == scene.label and item.meta["class_name"] == NAMES[scene.label]
        assert item.meta["part_names"] == [ds.part_names[p] for p, _ in parts]


def test_partimagenet_hand_written_fixture(tmp_path: Path) -> None:
    data = {
        "images": [{"id": 0, "file_name": "n01440764_10026.JPEG", "width": 5, "height": 4}],
        "annotations": [
            {
                "id": 1,
                "image_id": 0,
                "category_id": 1,
                "iscrowd": 0,
                "area": 6.0,
                "bbox": [1, 1, 3, 2],
                "segmentation": [[1, 1, 4, 1, 4, 3, 1, 3], [0, 0, 1, 1], [3, 3]],  # released files hold slivers
            },
            {
                "id": 2,
                "image_id": 0,
                "category_id": 0,
                "iscrowd": 0,
                "area": 4.0,
                "bbox": [4, 0, 1, 4],
                "segmentation": {"size": [4, 5], "counts": [16, 4]},
            },
        ],
        "categories": [
            {"id": 0, "name": "Quadruped Head", "supercategory": "Quadruped"},
            {"id": 1, "name": "Quadruped Body", "supercategory": "Quadruped"},
            {"id": 2, "name": "Fish Head", "supercategory": "Fish"},
        ],
    }
    (tmp_path / "annotations").mkdir()
    (tmp_path / "annotations" / "test.json").write_text(json.dumps(data), encoding="utf-8")
    save_jpeg(np.zeros((4, 5, 3), np.uint8), tmp_path / "images" / "test" / "n01440764_10026.JPEG")
    ds = PartImageNetDataset(tmp_path, "test")
    assert ds.classes == ["Quadruped", "Fish"] and ds.part_to_class.tolist() == [0, 0, 1]
    item = ds[0]
    assert item.label == 0 and item.meta["part_names"] == ["Quadruped Body", "Quadruped Head"]
    np.testing.assert_array_equal(item.instance_labels, [1, 0])
    assert item.masks[0].sum() == 6 and item.masks[1][:, 4].all()
