"""DAVIS (video object segmentation) and SPair-71k (keypoint-annotated image pairs) formats: round trips,
real-layout fixtures written literally, bad inputs and laziness. Retrieval formats are in
test_formats_retrieval.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers.format_scenes import SPECS, make_scene, touch_images
from vitscope.data.formats.davis import DavisDataset, davis_palette, write_davis
from vitscope.data.formats.errors import DatasetFormatError
from vitscope.data.formats.spair import SPairDataset, write_spair
from vitscope.data.images import ImageLoadError, load_rgb
from vitscope.data.items import ImagePair, VideoSequence


# ------------------------------------------------------------------------------------------ DAVIS
def test_davis_palette_is_the_voc_colormap():
    pal = davis_palette()
    assert pal.shape == (256, 3) and pal.dtype == np.uint8
    assert pal[:6].tolist() == [[0, 0, 0], [128, 0, 0], [0, 128, 0], [128, 128, 0], [0, 0, 128], [128, 0, 128]]
    assert pal[255].tolist() == [224, 224, 192]


def test_davis_round_trip(tmp_path):
    video_a = [
        make_scene([{"inst": 5, "rect": (0, 0, 10, 10)}, {"inst": 2, "rect": (5, 5, 20, 20)}], index=0),
        make_scene([{"inst": 9, "rect": (30, 0, 40, 8)}, {"inst": 5, "rect": (1, 1, 12, 12)}], index=1),
        make_scene([{"inst": 2, "rect": (10, 10, 30, 30)}], index=2),
    ]
    video_b = [make_scene([{"inst": 1, "rect": (3, 3, 9, 9)}], index=3)] * 2
    write_davis([video_a, video_b], tmp_path, split="val", names=["cows", "dog"])
    assert (tmp_path / "ImageSets/2017/val.txt").read_text() == "cows\ndog\n"
    ds = DavisDataset(tmp_path, split="val")
    assert len(ds) == 2 and ds.name == "davis2017-val" and ds.root == tmp_path
    seq = ds[0]
    assert isinstance(seq, VideoSequence) and seq.name == "cows" and len(seq.frame_paths) == 3
    assert Image.open(seq.mask_paths[0]).mode == "P"
    masks = seq.masks()
    order = {5: 1, 2: 2, 9: 3}  # first appearance over frames, objects in drawing order
    for t, scene in enumerate(video_a):
        expected = np.zeros((32, 48), dtype=np.uint8)
        for o in scene.objects:
            expected[o.mask] = order[o.instance_id]
        np.testing.assert_array_equal(masks[t], expected)
    assert ds[-1].name == "dog" and ds[-1].masks().max() == 1
    assert [s.name for s in ds] == ["cows", "dog"]
    with pytest.raises(IndexError):
        ds[2]


def _davis_fixture(root: Path, frames: int = 2, seq: str = "bear") -> None:
    """A DAVIS sequence written by hand: JPEGs, palette PNGs (putpalette), ImageSets/2017/val.txt."""
    (root / "ImageSets/2017").mkdir(parents=True)
    (root / "ImageSets/2017/val.txt").write_text(f"{seq}\n")
    (root / "ImageSets/2017/train.txt").write_text("")
    for t in range(frames):
        img_dir, ann_dir = root / "JPEGImages/480p" / seq, root / "Annotations/480p" / seq
        img_dir.mkdir(parents=True, exist_ok=True)
        ann_dir.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 6), (10 * t, 0, 0)).save(img_dir / f"{t:05d}.jpg")
        idx = np.zeros((6, 8), dtype=np.uint8)
        idx[1:3, 1:4] = 1
        idx[4:, 5:] = 2
        png = Image.new("P", (8, 6))
        png.putdata(idx.reshape(-1).tolist())
        png.putpalette([0, 0, 0, 128, 0, 0, 0, 128, 0] + [0] * (253 * 3))
        png.save(ann_dir / f"{t:05d}.png")


def test_davis_hand_written_fixture_reads_palette_indices(tmp_path):
    _davis_fixture(tmp_path)
    ds = DavisDataset(tmp_path)
    masks = ds[0].masks()
    assert masks.shape == (2, 6, 8) and masks.dtype == np.uint8
    assert sorted(np.unique(masks).tolist()) == [0, 1, 2]  # indices, not RGB colours
    assert masks[0, 1, 1] == 1 and masks[0, 5, 7] == 2
    assert len(DavisDataset(tmp_path, split="train")) == 0


def test_davis_bad_inputs(tmp_path):
    with pytest.raises(DatasetFormatError, match="val.txt"):
        DavisDataset(tmp_path)
    _davis_fixture(tmp_path)
    with pytest.raises(DatasetFormatError, match="resolution"):
        DavisDataset(tmp_path, resolution="1080p")
    (tmp_path / "Annotations/480p/bear/00000.png").unlink()  # one annotation, but not of the first frame
    with pytest.raises(DatasetFormatError, match="sequence 'bear'.*2 frames.*1 annotations"):
        DavisDataset(tmp_path)
    (tmp_path / "ImageSets/2017/val.txt").write_text("ghost\n")
    with pytest.raises(DatasetFormatError, match="sequence 'ghost'"):
        DavisDataset(tmp_path)
    (tmp_path / "ImageSets/2017/val.txt").write_text("../../etc\n")
    with pytest.raises(DatasetFormatError, match="unsafe path '../../etc'"):
        DavisDataset(tmp_path)


def test_davis_rgb_mask_is_refused_naming_the_file(tmp_path):
    _davis_fixture(tmp_path)
    Image.new("RGB", (8, 6), (128, 0, 0)).save(tmp_path / "Annotations/480p/bear/00001.png")
    with pytest.raises(DatasetFormatError, match="00001.png has mode 'RGB'"):
        DavisDataset(tmp_path)[0].masks()


def test_davis_is_lazy(tmp_path):
    (tmp_path / "ImageSets/2017").mkdir(parents=True)
    (tmp_path / "ImageSets/2017/val.txt").write_text("empty\n")
    touch_images([tmp_path / f"{d}/480p/empty/0000{t}.{e}" for t in range(3) for d, e in
                  (("JPEGImages", "jpg"), ("Annotations", "png"))])  # fmt: skip
    seq = DavisDataset(tmp_path)[0]
    assert len(seq.frame_paths) == 3
    with pytest.raises(DatasetFormatError, match="00000.png"):
        seq.masks()
    with pytest.raises(ImageLoadError, match="00000.jpg"):
        load_rgb(seq.frame_paths[0])


# ------------------------------------------------------------------------------------------ SPair
def test_spair_round_trip(tmp_path):
    kps_a = [(2, 3, 1), (4.25, 5, 1), (6, 7, 0), (1, 1, 1)]
    kps_b = [(12, 13, 1), (14, 15, 0), (16, 17, 1), (11.5, 11, 1)]
    a = make_scene([{"inst": 1, "rect": (0, 0, 10, 12), "kps": kps_a}], index=1)
    b = make_scene([{"inst": 2, "rect": (10, 10, 30, 28), "kps": kps_b}], index=2)
    c = make_scene([{"inst": 3, "cls": 1, "rect": (3, 4, 9, 9), "kps": [(4, 5, 1), (6, 6, 1)]}], index=3)
    d = make_scene([{"inst": 4, "cls": 1, "rect": (1, 1, 40, 30), "kps": [(5, 5, 1), (7, 7, 1)]}], index=4)
    write_spair([(a, b), (c, d), (b, a)], tmp_path, SPECS, split="test")
    ds = SPairDataset(tmp_path, split="test")
    assert len(ds) == 3 and ds.name == "spair71k-test"
    p = ds[0]
    assert isinstance(p, ImagePair) and p.category == "cat"
    np.testing.assert_array_equal(p.src_kps, np.float32([[2, 3], [1, 1]]))  # visible in both only
    np.testing.assert_array_equal(p.trg_kps, np.float32([[12, 13], [11.5, 11]]))
    assert p.src_kps.dtype == np.float32 and p.trg_kps.shape == (2, 2)
    np.testing.assert_array_equal(p.src_box, a.objects[0].box)
    np.testing.assert_array_equal(p.trg_box, b.objects[0].box)
    assert p.meta["kps_ids"] == ["0", "3"] and p.meta["src_imsize"] == [48, 32, 3]
    assert ds[-1].src_path == p.trg_path
    assert [x.category for x in SPairDataset(tmp_path, category="car")] == ["car"]
    ann = json.loads((tmp_path / "ImageAnnotation/cat/000001.json").read_text())
    assert ann["kps"]["2"] is None and ann["bndbox"] == [0, 0, 10, 12] and ann["image_width"] == 48
    assert len((tmp_path / "Layout/large/test.txt").read_text().split()) == 3


PAIR_JSON = {
    "pair_id": 1,
    "filename": "000001-2008_000585-2008_002221:aeroplane",
    "src_imname": "2008_000585.jpg",
    "trg_imname": "2008_002221.jpg",
    "src_imsize": [500, 333, 3],
    "trg_imsize": [500, 375, 3],
    "src_bndbox": [33, 77, 484, 241],
    "trg_bndbox": [16, 102, 471, 296],
    "category": "aeroplane",
    "src_pose": "Left",
    "trg_pose": "Left",
    "src_kps": [[120, 150], [200, 160], [452, 178]],
    "trg_kps": [[100, 180], [210, 201], [440, 230]],
    "kps_ids": ["1", "2", "7"],
    "viewpoint_variation": 0,
    "scale_variation": 0,
    "truncation": 0,
    "occlusion": 0,
    "mirror": 0,
}


def _spair_fixture(root: Path, pair: dict | str = PAIR_JSON) -> Path:
    touch_images([root / "JPEGImages/aeroplane/2008_000585.jpg", root / "JPEGImages/aeroplane/2008_002221.jpg"])
    d = root / "PairAnnotation/test"
    d.mkdir(parents=True)
    f = d / "000001-2008_000585-2008_002221:aeroplane.json"
    f.write_text(pair if isinstance(pair, str) else json.dumps(pair))
    return f


def test_spair_hand_written_fixture_and_laziness(tmp_path):
    _spair_fixture(tmp_path)
    p = SPairDataset(tmp_path)[0]  # 0-byte images: nothing is decoded
    assert p.src_path.endswith("JPEGImages/aeroplane/2008_000585.jpg") and p.category == "aeroplane"
    np.testing.assert_array_equal(p.src_box, np.float32([33, 77, 484, 241]))  # xmax kept as exclusive x2
    np.testing.assert_array_equal(p.trg_kps[2], np.float32([440, 230]))
    assert p.meta["pair_id"] == 1 and p.meta["trg_imsize"] == [500, 375, 3]
    with pytest.raises(ImageLoadError):
        load_rgb(p.src_path)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ("{not json", "cannot parse pair annotation .*aeroplane.json"),
        ({"src_kps": None}, "missing keys \\['src_kps'\\]"),
        ({"src_imname": "../../../etc/passwd"}, "unsafe path '../../../etc/passwd'"),
        ({"trg_imname": "2008_999999.jpg"}, "2008_999999.jpg named in .*aeroplane.json not found"),
        ({"trg_kps": [[1, 2]]}, "3 src_kps but 1 trg_kps"),
        ({"src_bndbox": [1, 2, 3]}, "'src_bndbox' must be"),
        ({"src_kps": [[1, 2], [3]]}, "'src_kps' must be a list of \\[x, y\\] pairs"),
    ],
)
def test_spair_bad_pairs_name_the_file(tmp_path, change, match):
    if isinstance(change, dict):
        change = {k: v for k, v in {**PAIR_JSON, **change}.items() if v is not None}
    _spair_fixture(tmp_path, change)
    ds = SPairDataset(tmp_path)  # lazy: the broken JSON is only read on access
    with pytest.raises(DatasetFormatError, match=match):
        ds[0]


def test_spair_missing_split(tmp_path):
    with pytest.raises(DatasetFormatError, match="PairAnnotation/val"):
        SPairDataset(tmp_path, split="val")
    with pytest.raises(DatasetFormatError, match="unknown SPair split"):
        SPairDataset(tmp_path, split="train")
