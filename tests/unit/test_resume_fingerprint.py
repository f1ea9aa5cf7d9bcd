"""The data fingerprint stored in results.json and keying resumable state."""

from __future__ import annotations

import os
import shutil

import numpy as np
from PIL import Image

from vitscope.data.open import as_source
from vitscope.data.synthetic.write import synthesize
from vitscope.engine.provenance import data_fingerprint


def _folder(root, n=3):
    root.mkdir()
    for i in range(n):
        Image.fromarray(np.full((8, 8, 3), i * 40, dtype=np.uint8)).save(root / f"{i}.png")
    return root


def test_fingerprint_is_stable_and_independent_of_the_folder_location(tmp_path):
    a = _folder(tmp_path / "a")
    fp = data_fingerprint(as_source(str(a)))
    assert fp == data_fingerprint(as_source(str(a)))  # stable
    assert len(fp["digest"]) == 16 and fp["num_files"] == 3 and fp["method"].startswith("stat")
    moved = tmp_path / "moved"
    os.rename(a, moved)  # rename keeps sizes and mtimes: same data, same fingerprint
    assert data_fingerprint(as_source(str(moved)))["digest"] == fp["digest"]


def test_fingerprint_changes_when_a_file_changes_or_is_added(tmp_path):
    a = _folder(tmp_path / "a")
    before = data_fingerprint(as_source(str(a)))["digest"]
    path = a / "1.png"
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    touched = data_fingerprint(as_source(str(a)))["digest"]
    assert touched != before
    Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(a / "new.png")
    assert data_fingerprint(as_source(str(a)))["digest"] not in (before, touched)


def test_annotated_data_fingerprint_covers_the_annotation_files(tmp_path):
    root = synthesize(tmp_path / "coco", "coco", n=4, size=32, seed=0)
    fp = data_fingerprint(as_source(f"{root}::coco"))
    assert fp["num_files"] >= 5  # 4 images + the annotation file (+ synth.json)
    ann = next(root.rglob("instances_*.json"))
    ann.write_text(ann.read_text() + " ")
    assert data_fingerprint(as_source(f"{root}::coco"))["digest"] != fp["digest"]
    copy = shutil.copytree(root, tmp_path / "copy", copy_function=shutil.copy2)  # copy2 keeps mtimes
    assert data_fingerprint(as_source(f"{copy}::coco"))["digest"] == \
        data_fingerprint(as_source(f"{root}::coco"))["digest"]
