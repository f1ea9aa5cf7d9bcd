"""DAVIS, SPair-71k, revisited Oxford/Paris, SOP and path-list formats: round trips, real-layout
fixtures written literally, bad inputs, laziness and a million-row list."""

from __future__ import annotations

import json
import os
import pickle
import uuid
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitscope.data.formats.davis import DavisDataset, davis_palette, write_davis
from vitscope.data.formats.errors import DatasetFormatError, safe_join
from vitscope.data.formats.path_list import PathListDataset, write_path_list
from vitscope.data.formats.revisitop import RevisitOPDataset, load_gnd, write_revisitop
from vitscope.data.formats.sop import SOPDataset, write_sop
from vitscope.data.formats.spair import SPairDataset, write_spair
from vitscope.data.images import ImageLoadError, load_rgb
from vitscope.data.items import AnnotatedImage, ImagePair, VideoSequence
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


# ----------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("bad", ["../x.jpg", "a/../../x.jpg", "/etc/passwd", "C:/x.jpg", "..\\x.jpg", ""])
def test_safe_join_refuses_escapes(tmp_path, bad):
    with pytest.raises(DatasetFormatError, match="line 3 of list.txt"):
        safe_join(tmp_path, bad, "line 3 of list.txt")
    assert safe_join(tmp_path, "a/b..c/x.jpg", "x") == tmp_path / "a/b..c/x.jpg"


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
    (tmp_path / "Annotations/480p/bear/00001.png").unlink()
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
SPECS = [
    ClassSpec("cat", ("body",), ("nose", "l_eye", "r_eye", "tail")),
    ClassSpec("car", ("body",), ("wheel_fl", "wheel_fr")),
]


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


# ------------------------------------------------------------------------------------- revisitop
def _retrieval_scenes() -> tuple[list[Scene], list[Scene]]:
    q = make_scene([{"inst": 7, "rect": (5, 5, 15, 15)}, {"inst": 3, "rect": (30, 2, 33, 5)}], index=0)
    db = [
        make_scene([{"inst": 7, "rect": (0, 0, 10, 10)}], index=1),  # r = 1.0 -> easy
        make_scene([{"inst": 7, "rect": (0, 0, 10, 4)}], index=2),  # 0.4 -> hard
        make_scene([{"inst": 7, "rect": (0, 0, 10, 1)}], index=3),  # 0.1 -> junk
        make_scene([{"inst": 8, "rect": (0, 0, 10, 10)}], index=4),  # other instance, same class -> negative
        make_scene([{"inst": 7, "rect": (0, 0, 5, 5)}, {"inst": 9, "rect": (0, 0, 6, 6)}], index=5),  # hidden
        make_scene([{"inst": 7, "rect": (0, 0, 10, 6)}], index=6),  # 0.6 -> easy (boundary)
    ]
    return [q], db


def test_revisitop_round_trip_and_protocol(tmp_path):
    queries, db = _retrieval_scenes()
    gnd_file = write_revisitop(queries, db, tmp_path, name="toy")
    assert gnd_file == tmp_path / "gnd_toy.pkl"
    ds = RevisitOPDataset(tmp_path)  # name inferred from the single gnd_*.pkl
    assert ds.name == "toy" and len(ds.queries) == 1 and len(ds.database) == 6 and len(ds) == 7
    g = ds.gnd[0]
    assert g.easy.tolist() == [0, 5] and g.hard.tolist() == [1] and g.junk.tolist() == [2]
    np.testing.assert_array_equal(g.bbx, np.float32([5, 5, 15, 15]))
    q = ds.queries[0]
    assert isinstance(q, AnnotatedImage) and q.meta["role"] == "query" and q.boxes.shape == (1, 4)
    assert ds[0].image_path == q.image_path and ds[-1].meta == {"name": "db_00005", "role": "database", "index": 5}
    easy, medium, hard = (ds.protocol(level) for level in ("easy", "Medium", "hard"))
    assert easy[0]["ok"].tolist() == [0, 5] and easy[0]["junk"].tolist() == [2, 1]
    assert medium[0]["ok"].tolist() == [0, 5, 1] and medium[0]["junk"].tolist() == [2]
    assert hard[0]["ok"].tolist() == [1] and hard[0]["junk"].tolist() == [2, 0, 5]
    assert hard[0]["ok"].dtype == np.int64
    with pytest.raises(DatasetFormatError, match="unknown protocol level"):
        ds.protocol("extreme")


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_revisitop_hand_written_gnd_with_numpy_arrays(tmp_path, protocol):
    gnd = {
        "imlist": ["all_souls_000013", "ashmolean_000283", "radcliffe_camera_000519"],
        "qimlist": ["all_souls_000001"],
        "gnd": [
            {
                "bbx": np.array([136.5, 34.1, 648.5, 955.7]),
                "easy": np.array([0], dtype=np.int64),
                "hard": np.array([2], dtype=np.int32),
                "junk": np.array([], dtype=np.int64),
            }
        ],
    }
    (tmp_path / "gnd_roxford5k.pkl").write_bytes(pickle.dumps(gnd, protocol=protocol))
    touch_images([tmp_path / "jpg" / f"{n}.jpg" for n in gnd["imlist"]])
    ds = RevisitOPDataset(tmp_path, "roxford5k")
    assert ds.gnd[0].hard.tolist() == [2] and ds.gnd[0].junk.size == 0
    assert ds.protocol("medium")[0]["ok"].tolist() == [0, 2]
    assert ds.database[2].image_path.endswith("jpg/radcliffe_camera_000519.jpg")
    assert load_gnd(tmp_path / "gnd_roxford5k.pkl")["qimlist"] == ["all_souls_000001"]
    with pytest.raises(DatasetFormatError, match="all_souls_000001.jpg .*query 0.* not found"):
        ds.queries[0]  # missing image named on access, not at construction


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _EvilEval:
    def __reduce__(self):
        return (eval, ("__import__('os').getcwd()",))


def test_revisitop_refuses_malicious_pickle_without_side_effects(tmp_path):
    marker = Path("/tmp") / f"pwned_{uuid.uuid4().hex}"
    payload = {"imlist": [], "qimlist": [], "gnd": [], "x": _Evil(str(marker))}
    (tmp_path / "gnd_evil.pkl").write_bytes(pickle.dumps(payload))
    with pytest.raises(DatasetFormatError, match=r"refusing to unpickle posix\.system from .*gnd_evil\.pkl"):
        RevisitOPDataset(tmp_path, "evil")
    assert not marker.exists()
    (tmp_path / "gnd_evil.pkl").write_bytes(pickle.dumps([_EvilEval()], protocol=0))
    with pytest.raises(DatasetFormatError, match=r"refusing to unpickle __builtin__\.eval"):
        load_gnd(tmp_path / "gnd_evil.pkl")
    (tmp_path / "gnd_evil.pkl").write_bytes(b"\x80\x04not a pickle")
    with pytest.raises(DatasetFormatError, match="cannot unpickle"):
        load_gnd(tmp_path / "gnd_evil.pkl")


@pytest.mark.parametrize(
    ("gnd", "match"),
    [
        ({"imlist": ["a"], "qimlist": ["q"], "gnd": [{"easy": [1], "hard": [], "junk": []}]}, "query 0 .*'easy'"),
        ({"imlist": ["a"], "qimlist": ["q"], "gnd": []}, "0 gnd entries for 1 queries"),
        ({"imlist": ["a"], "qimlist": ["q"]}, "missing keys \\['gnd'\\]"),
        ({"imlist": ["../a"], "qimlist": [], "gnd": []}, None),
    ],
)
def test_revisitop_bad_gnd(tmp_path, gnd, match):
    (tmp_path / "gnd_x.pkl").write_bytes(pickle.dumps(gnd))
    if match is None:  # unsafe names are refused when the image is accessed
        with pytest.raises(DatasetFormatError, match="unsafe path '../a.jpg'"):
            RevisitOPDataset(tmp_path, "x").database[0]
        return
    with pytest.raises(DatasetFormatError, match=match):
        RevisitOPDataset(tmp_path, "x")


# -------------------------------------------------------------------------------------------- SOP
def test_sop_round_trip(tmp_path):
    scenes = [make_scene([{"inst": i % 4, "cls": i % 2, "rect": (0, 0, 9, 9)}], index=i) for i in range(10)]
    write_sop(scenes, tmp_path, split_fraction=0.5, class_specs=SPECS)
    train, test = SOPDataset(tmp_path, "train"), SOPDataset(tmp_path, "test")
    assert len(train) + len(test) == 10 and train.name == "sop-train"
    assert set(train.labels.tolist()) == {0, 1} and set(test.labels.tolist()) == {2, 3}  # disjoint classes
    items = list(train) + list(test)
    assert sorted((x.label, x.meta["super_class"]) for x in items) == sorted((i % 4, i % 2) for i in range(10))
    assert all(Path(x.image_path).is_file() for x in items)
    assert items[0].image_path.endswith("cat_final/0_0.JPG") and items[0].meta["image_id"] == 1
    assert (tmp_path / "Ebay_test.txt").read_text().splitlines()[0] == "image_id class_id super_class_id path"


SOP_TEXT = """image_id class_id super_class_id path
1 1 1 bicycle_final/111085122871_0.JPG
2 1 1 bicycle_final/111085122871_1.JPG
3 2 1 bicycle_final/111265328556_0.JPG
"""


def test_sop_hand_written_fixture_and_laziness(tmp_path):
    (tmp_path / "Ebay_train.txt").write_text(SOP_TEXT)
    ds = SOPDataset(tmp_path, split="train")
    assert len(ds) == 3 and ds.labels.tolist() == [0, 0, 1]
    with pytest.raises(DatasetFormatError, match="111265328556_0.JPG \\(line 4 of Ebay_train.txt\\) not found"):
        ds[-1]
    touch_images([tmp_path / "bicycle_final" / n for n in ("111085122871_0.JPG", "111085122871_1.JPG",
                                                           "111265328556_0.JPG")])  # fmt: skip
    x = ds[-1]
    assert x.label == 1 and x.meta == {"super_class": 0, "image_id": 3, "line": 4}
    with pytest.raises(ImageLoadError):
        load_rgb(x.image_path)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("id class super path\n1 1 1 a.JPG\n", "line 1 of Ebay_test.txt: expected header"),
        (SOP_TEXT + "4 2 1\n", "line 5 of Ebay_test.txt: expected 'image_id"),
        (SOP_TEXT + "\n5 x 1 a.JPG\n", "line 6 of Ebay_test.txt: ids must be integers"),
        (SOP_TEXT + "4 0 1 a.JPG\n", "line 5 of Ebay_test.txt: ids are 1-based"),
        (SOP_TEXT + "4 2 1 ../../secret.JPG\n", "unsafe path '../../secret.JPG' in line 5 of Ebay_test.txt"),
        (SOP_TEXT + "4 2 1 /abs/secret.JPG\n", "unsafe path '/abs/secret.JPG' in line 5"),
        ("", "Ebay_test.txt is empty"),
    ],
)
def test_sop_malformed_rows_name_the_line(tmp_path, text, match):
    (tmp_path / "Ebay_test.txt").write_text(text)
    with pytest.raises(DatasetFormatError, match=match):
        SOPDataset(tmp_path)


def test_sop_missing_list(tmp_path):
    with pytest.raises(DatasetFormatError, match="Ebay_test.txt not found"):
        SOPDataset(tmp_path)


def test_sop_million_rows_parse_lazily(tmp_path):
    """A million rows parse into compact columns (timing lives in benchmarks, not tests)."""
    n = 1_000_000
    ids = np.arange(1, n + 1)
    rows = "\n".join(map("{0} {1} {2} bicycle_final/{0}_0.JPG".format, ids, ids // 5 + 1, ids % 12 + 1))
    (tmp_path / "Ebay_train.txt").write_text("image_id class_id super_class_id path\n" + rows + "\n")
    del rows
    ds = SOPDataset(tmp_path, "train")
    assert len(ds) == n
    assert ds.labels[-1] == n // 5 and ds._path(n - 1) == f"bicycle_final/{n}_0.JPG"


# -------------------------------------------------------------------------------------- path list
def test_path_list_round_trip(tmp_path):
    scenes = [make_scene([{"inst": 10 + i % 3, "cls": i % 2, "rect": (0, 0, 9, 9)}], index=i) for i in range(6)]
    list_file = write_path_list(scenes, tmp_path, "hotels.txt")
    ds = PathListDataset(list_file)
    assert ds.name == "hotels" and ds.root == tmp_path and ds.class_names is None
    assert ds.labels.tolist() == [10 + i % 3 for i in range(6)]
    assert all(Path(x.image_path).is_file() for x in ds)
    names = [f"hotel_{k}" for k in range(20)]
    named = PathListDataset(write_path_list(scenes, tmp_path / "named", label="instance", label_names=names))
    assert [named.class_names[x.label] for x in named] == [names[10 + i % 3] for i in range(6)]
    assert named[0].meta["label_name"] == "hotel_10" and named.class_names == ["hotel_10", "hotel_11", "hotel_12"]
    by_class = PathListDataset(write_path_list(scenes, tmp_path / "cls", label="class"))
    assert by_class.labels.tolist() == [i % 2 for i in range(6)]


def test_path_list_hand_written_fixture(tmp_path):
    (tmp_path / "train.txt").write_text(
        "# GLDv2-style list\n\ntrain/a/0001.jpg landmark_7\n  train/b/0002.jpg 12\n"
        "train/my photos/0003.jpg landmark_7\n# trailing comment\n"
    )
    ds = PathListDataset(tmp_path / "train.txt", root=tmp_path / "images")
    assert len(ds) == 3 and ds.class_names == ["landmark_7", "12"] and ds.labels.tolist() == [0, 1, 0]
    touch_images([tmp_path / "images/train/my photos/0003.jpg"])
    assert ds[-1].label == 0 and ds[-1].meta == {"line": 5, "label_name": "landmark_7"}
    with pytest.raises(DatasetFormatError, match="0001.jpg \\(line 3 of train.txt\\) not found"):
        ds[0]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("a.jpg 1\nlonely.jpg\n", "line 2 of list.txt: expected 'path label'"),
        ("a.jpg 1\n../../x.jpg 2\n", "unsafe path '../../x.jpg' in line 2 of list.txt"),
        ("/abs/x.jpg 2\n", "unsafe path '/abs/x.jpg' in line 1"),
    ],
)
def test_path_list_bad_lines(tmp_path, text, match):
    (tmp_path / "list.txt").write_text(text)
    with pytest.raises(DatasetFormatError, match=match):
        PathListDataset(tmp_path / "list.txt")
    with pytest.raises(DatasetFormatError, match="nope.txt not found"):
        PathListDataset(tmp_path / "nope.txt")
