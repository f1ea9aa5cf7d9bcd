"""Fuzzing the data readers (hypothesis): whatever a file holds, a reader loads it or raises vitscope's own error
naming the file; never another exception (which the command line would report as a bug in vitscope)."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vitscope.data.formats.coco import CocoDataset
from vitscope.data.formats.revisitop import load_gnd
from vitscope.data.images import ImageLoadError, load_rgb
from vitscope.errors import VitscopeError

#: VITSCOPE_FUZZ_EXAMPLES=400 for a longer search than the suite affords
FUZZ = settings(max_examples=int(os.environ.get("VITSCOPE_FUZZ_EXAMPLES", "40")), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-3, 70), st.floats(allow_nan=True), st.text(max_size=6))
JSON = st.recursive(JSON_LEAF, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                    max_leaves=12)
VALID = {"images": [{"id": 1, "file_name": "a.jpg", "width": 8, "height": 6}],
         "annotations": [{"id": 7, "image_id": 1, "category_id": 3, "iscrowd": 0, "area": 4.0, "bbox": [1, 1, 2, 2],
                          "segmentation": [[1, 1, 3, 1, 3, 3, 1, 3]]}],
         "categories": [{"id": 3, "name": "cat"}]}
PATHS = [("images", 0, "id"), ("images", 0, "width"), ("images", 0, "file_name"), ("annotations", 0, "bbox"),
         ("annotations", 0, "segmentation"), ("annotations", 0, "image_id"), ("annotations", 0, "category_id"),
         ("annotations", 0, "id"), ("categories", 0, "id"), ("annotations", 0, "area"), ("annotations", 0, "iscrowd")]


def _load_coco(root: Path, doc) -> None:
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    (root / "annotations" / "instances_val2017.json").write_text(json.dumps(doc))
    ds = CocoDataset(root)
    for i in range(len(ds)):
        with contextlib.suppress(VitscopeError):  # e.g. the image file is missing: the item says so
            ds[i]


@FUZZ
@given(doc=JSON)
def test_coco_reader_on_any_json(tmp_path, doc) -> None:
    with contextlib.suppress(VitscopeError):
        _load_coco(tmp_path, doc)


@FUZZ
@given(where=st.sampled_from(PATHS), value=JSON)
def test_coco_reader_on_a_valid_file_with_one_value_replaced(tmp_path, where, value) -> None:
    doc = json.loads(json.dumps(VALID))
    key, index, field = where
    doc[key][index][field] = value
    with contextlib.suppress(VitscopeError):
        _load_coco(tmp_path, doc)


@FUZZ
@given(data=st.binary(max_size=200))
def test_image_decoder_on_any_bytes(tmp_path, data: bytes) -> None:
    path = tmp_path / "x.png"
    path.write_bytes(data)
    try:
        load_rgb(path)
    except ImageLoadError as err:
        assert str(path) in str(err)


@FUZZ
@given(obj=st.recursive(st.one_of(st.integers(), st.text(max_size=4), st.none()),
                        lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner,
                                                                                             max_size=3)),
                        max_leaves=8), cut=st.integers(0, 60))
def test_ground_truth_unpickler_on_any_pickle(tmp_path, obj, cut: int) -> None:
    data = pickle.dumps(obj)
    path = tmp_path / "gnd_x.pkl"
    path.write_bytes(data[: len(data) - cut] if cut < len(data) else data)
    with contextlib.suppress(VitscopeError):
        load_gnd(path)


def test_ground_truth_unpickler_refuses_code(tmp_path) -> None:
    class Evil:
        def __reduce__(self):
            return (print, ("ran",))

    path = tmp_path / "gnd_evil.pkl"
    path.write_bytes(pickle.dumps(Evil()))
    with pytest.raises(VitscopeError, match="print"):
        load_gnd(path)
