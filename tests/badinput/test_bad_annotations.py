"""docs/errors.md, annotations: a COCO-format world with one thing wrong, read by ``analyze`` or ``probe``."""

from __future__ import annotations

from helpers.bad_input import analyze, copy_world, edit_json, finished, one_error, skipped, warned
from helpers.cli import cli

ANNOTATIONS = "annotations/instances_val2017.json"


def _probe(world, out, fmt="coco"):
    return cli("probe", "-m", "tiny-vit", "-d", f"{world}::{fmt}", "-o", str(out))


def _damaged(coco_world, tmp_path, edit):
    world = copy_world(coco_world, tmp_path / "world")
    edit_json(world / ANNOTATIONS, lambda doc: edit(doc, world))
    return world


def test_annotations_malformed_json(coco_world, tmp_path):
    world = copy_world(coco_world, tmp_path / "world")
    (world / ANNOTATIONS).write_text('{"images": [1, 2,')
    one_error(_probe(world, tmp_path / "out"), "malformed JSON in")


def test_annotations_malformed_json_nested_too_deeply(coco_world, tmp_path):
    """Nesting deeper than Python's parser recurses raised a RecursionError (a traceback, "a bug in vitscope")."""
    world = copy_world(coco_world, tmp_path / "world")
    (world / ANNOTATIONS).write_text('{"images": ' + "[" * 100_000 + "]" * 100_000 + "}")
    one_error(_probe(world, tmp_path / "out"), "nested too deeply to be an annotation file")


def test_annotations_wrong_types(coco_world, tmp_path):
    world = _damaged(coco_world, tmp_path, lambda doc, _: doc["images"][0].__setitem__("height", "32"))
    one_error(_probe(world, tmp_path / "out"), "image entry 0 (id 1) of instances_val2017.json: height must be a")


def test_annotations_malformed_box(coco_world, tmp_path):
    world = _damaged(coco_world, tmp_path, lambda doc, _: doc["annotations"][0].__setitem__("bbox", [1, 2, "3"]))
    one_error(_probe(world, tmp_path / "out"), "bbox must be four finite numbers")


def test_annotations_box_outside_the_image(coco_world, tmp_path):
    over = _damaged(coco_world, tmp_path, lambda doc, _: doc["annotations"][0].__setitem__("bbox", [20, 20, 50, 50]))
    from vitscope.data.formats.coco import CocoDataset

    assert CocoDataset(over)[0].boxes[0].tolist() == [20, 20, 32, 32]  # clipped to the 32 x 32 image
    outside = copy_world(coco_world, tmp_path / "outside")
    edit_json(outside / ANNOTATIONS, lambda doc: doc["annotations"][0].__setitem__("bbox", [40, 40, 5, 5]))
    one_error(_probe(outside, tmp_path / "out"), "lies outside its 32x32 image")


def test_annotations_mask_of_another_size(coco_world, tmp_path):
    def taller(doc, _):
        doc["images"][0]["height"] = 48  # the file is 32 px high: masks would be stretched onto it
        for ann in doc["annotations"]:
            if ann["image_id"] == doc["images"][0]["id"]:
                ann["segmentation"], ann["bbox"] = [[1, 1, 10, 1, 10, 10]], [1, 1, 9, 9]
    world = _damaged(coco_world, tmp_path, taller)
    out = tmp_path / "out"
    result = analyze(f"{world}::coco", out, analyses="saliency_iou")
    doc = finished(result, out)
    assert "masks are 32x48 but the image is 32x32" in warned(result, "000000000001.jpg")
    assert list(skipped(doc)) == ["000000000001.jpg"] and doc["num_images"] == 3


def test_annotations_path_escaping_the_root(coco_world, tmp_path):
    for k, name in enumerate(["../../etc/passwd", "/etc/passwd"]):
        world = copy_world(coco_world, tmp_path / f"world{k}")
        edit_json(world / ANNOTATIONS, lambda doc, name=name: doc["images"][0].__setitem__("file_name", name))
        one_error(_probe(world, tmp_path / f"out{k}"), f"refusing unsafe path '{name}' in image entry 0 (id 1)")


def test_annotations_missing_image_file(coco_world, tmp_path):
    world = copy_world(coco_world, tmp_path / "world")
    (world / "val2017" / "000000000002.jpg").unlink()
    out = tmp_path / "out"
    result = analyze(f"{world}::coco", out, analyses="saliency_iou")
    doc = finished(result, out)
    assert "image file not found" in skipped(doc)["000000000002.jpg"] and doc["num_images"] == 3
    one_error(analyze(f"{world}::coco", tmp_path / "strict", "--strict", analyses="saliency_iou"),
              "000000000002.jpg): image file not found")


def test_annotations_duplicate_ids(coco_world, tmp_path):
    images = _damaged(coco_world, tmp_path, lambda doc, _: doc["images"][1].__setitem__("id", 1))
    one_error(_probe(images, tmp_path / "out"), "image ids must be distinct; repeated: 1")
    annotations = copy_world(coco_world, tmp_path / "again")
    edit_json(annotations / ANNOTATIONS, lambda doc: doc["annotations"][1].__setitem__("id", 1))
    one_error(_probe(annotations, tmp_path / "out2"), "annotation ids must be distinct; repeated: 1")


def test_annotations_without_objects(coco_world, tmp_path):
    world = _damaged(coco_world, tmp_path, lambda doc, _: (doc.__setitem__("categories", []),
                                                           doc.__setitem__("annotations", [])))
    one_error(_probe(world, tmp_path / "out"), "coco data with 0 annotated region(s) of 0 class(es)")


def test_annotations_unknown_category(coco_world, tmp_path):
    world = _damaged(coco_world, tmp_path, lambda doc, _: doc["annotations"][0].__setitem__("category_id", 999))
    one_error(_probe(world, tmp_path / "out"), "unknown category_id 999")


def test_data_in_the_wrong_format(coco_world, tmp_path):
    one_error(_probe(coco_world, tmp_path / "out", fmt="imagefolder"), f"pass --data {coco_world}::coco")


def test_data_unknown_format(coco_world, tmp_path):
    one_error(_probe(coco_world, tmp_path / "out", fmt="cocoa"), "unknown dataset format 'cocoa'")
