"""Revisited Oxford/Paris, SOP and path-list formats (retrieval), and safe_join: round trips, real-layout
fixtures written literally, bad inputs, laziness and a million-row list. DAVIS and SPair-71k are in
test_formats_video.py."""

from __future__ import annotations

import os
import pickle
import uuid
from pathlib import Path

import numpy as np
import pytest

from helpers.format_scenes import SPECS, make_scene, touch_images
from vitscope.data.formats.errors import DatasetFormatError, safe_join
from vitscope.data.formats.path_list import PathListDataset, write_path_list
from vitscope.data.formats.revisitop import RevisitOPDataset, load_gnd, write_revisitop
from vitscope.data.formats.sop import SOPDataset, write_sop
from vitscope.data.images import ImageLoadError, load_rgb
from vitscope.data.items import AnnotatedImage
from vitscope.data.synthetic.scene import Scene


# ----------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("bad", ["../x.jpg", "a/../../x.jpg", "/etc/passwd", "C:/x.jpg", "..\\x.jpg", ""])
def test_safe_join_refuses_escapes(tmp_path, bad):
    with pytest.raises(DatasetFormatError, match="line 3 of list.txt"):
        safe_join(tmp_path, bad, "line 3 of list.txt")
    assert safe_join(tmp_path, "a/b..c/x.jpg", "x") == tmp_path / "a/b..c/x.jpg"


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
    assert len(ds) == 3 and ds.class_names == ["12", "landmark_7"] and ds.labels.tolist() == [1, 0, 1]  # sorted
    touch_images([tmp_path / "images/train/my photos/0003.jpg"])
    assert ds[-1].label == 1 and ds[-1].meta == {"line": 5, "label_name": "landmark_7"}
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


def test_path_list_paths_resolve_from_the_lists_folder(tmp_path, monkeypatch):
    from vitscope.data.annotated_source import AnnotatedSource
    from vitscope.workflows.probe import _labelled_split

    scenes = [make_scene([{"inst": 1 + i % 2, "cls": i % 2, "rect": (0, 0, 9, 9)}], index=i) for i in range(8)]
    list_file = write_path_list(scenes, tmp_path / "world")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # the list's paths mean nothing from here
    ds = PathListDataset(Path("..") / "world" / "list.txt")
    source = AnnotatedSource(ds)
    assert list(source.paths) == [x.image_path for x in ds]
    assert all(Path(p).is_file() for p in source.paths)
    train, test = _labelled_split(ds, "list", 0.5, 0)
    assert len(train) + len(test) == 8
    assert all(Path(p).is_file() for part in (train, test) for p in part.paths)
    assert list_file.parent == tmp_path / "world"


def test_the_first_items_of_a_path_list_are_its_files_from_the_lists_folder(tmp_path, monkeypatch):
    """``probe --limit`` on a list: the kept images are read, split and fingerprinted as the list's folder resolves
    them, whatever the current directory."""
    from vitscope.data.annotated_source import AnnotatedSource
    from vitscope.data.fingerprint import data_fingerprint
    from vitscope.data.first_items import FirstItems
    from vitscope.workflows.probe import _labelled_split

    scenes = [make_scene([{"inst": 1 + i % 2, "cls": i % 2, "rect": (0, 0, 9, 9)}], index=i) for i in range(8)]
    write_path_list(scenes, tmp_path / "world")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    whole = PathListDataset(Path("..") / "world" / "list.txt")
    kept = FirstItems(whole, 4)
    source = AnnotatedSource(kept)
    assert list(source.paths) == [whole[i].image_path for i in range(4)]
    assert all(Path(p).is_file() for p in source.paths)
    train, test = _labelled_split(kept, "list", 0.5, 6)  # a seed whose test half holds both classes
    assert len(train) + len(test) == 4 and all(Path(p).is_file() for part in (train, test) for p in part.paths)
    before = data_fingerprint(source)["digest"]
    first = tmp_path / "world" / "images" / "000000.jpg"
    st = first.stat()
    os.utime(first, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a kept image changes
    assert data_fingerprint(AnnotatedSource(kept))["digest"] != before


def test_a_folder_holding_one_path_list_is_the_list_format(tmp_path):
    from vitscope.data.load import detect_format, load_dataset

    scenes = [make_scene([{"inst": 3, "cls": 0, "rect": (0, 0, 9, 9)}], index=i) for i in range(3)]
    list_file = write_path_list(scenes, tmp_path / "world")  # world/list.txt beside world/images/
    assert detect_format(tmp_path / "world") == "list"
    for fmt in (None, "list"):
        ds = load_dataset(tmp_path / "world", fmt)
        assert ds.list_file == list_file and len(ds) == 3 and Path(ds[0].image_path).is_file()
    (tmp_path / "world" / "README.txt").write_text("two lists: which one is meant is not for us to guess\n")
    assert detect_format(tmp_path / "world") == "imagefolder"
    with pytest.raises(DatasetFormatError, match="without one 'path label' list"):
        PathListDataset(tmp_path / "world")
    (tmp_path / "world" / "README.txt").unlink()
    (tmp_path / "world" / "list.txt").write_text("missing/0.jpg 1\n")  # names no file of the folder
    assert detect_format(tmp_path / "world") == "imagefolder"
