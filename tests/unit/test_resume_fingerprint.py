"""The data fingerprint stored in results.json and keying resumable state."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
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


def _two_lists_in_one_folder(tmp_path):
    """``lists/train.txt`` and ``lists/test.txt``: the halves of one synthetic list, beside each other."""
    root = synthesize(tmp_path / "lists", "list", n=8, size=32, seed=0)
    rows = [line for line in (root / "list.txt").read_text().splitlines() if line and not line.startswith("#")]
    (root / "list.txt").unlink()
    (root / "train.txt").write_text("\n".join(rows[:4]) + "\n")
    (root / "test.txt").write_text("\n".join(rows[4:]) + "\n")
    return root


def test_each_split_or_list_under_one_root_signs_the_files_its_reader_selected(tmp_path):
    """Two splits of one release, or two lists in one folder, are two datasets (the feature cache and resume are keyed
    by the fingerprint): it signs the images the reader selected in item order, then its split or list file."""
    from vitscope.data.fingerprint import stat_digest

    sop = synthesize(tmp_path / "sop", "sop", n=12, size=32, seed=0)
    lists = _two_lists_in_one_folder(tmp_path)
    for spec, root, defining in ((f"{sop}::sop:train", sop, "Ebay_train.txt"),
                                 (f"{sop}::sop:test", sop, "Ebay_test.txt"),
                                 (f"{lists}/train.txt::list", lists, "train.txt"),
                                 (f"{lists}/test.txt::list", lists, "test.txt")):
        source = as_source(spec)
        expected = [source.dataset[i].image_path for i in range(len(source))] + [str(root / defining)]
        digest, count = stat_digest(expected, root)
        assert data_fingerprint(source)["digest"] == digest[:16] and data_fingerprint(source)["num_files"] == count
    digests = {data_fingerprint(as_source(spec))["digest"] for spec in (
        f"{sop}::sop:train", f"{sop}::sop:test", f"{lists}/train.txt::list", f"{lists}/test.txt::list")}
    assert len(digests) == 4


@pytest.mark.parametrize(("fmt", "pattern"), [("imagenet-boxes", "boxes/*/*.xml"), ("imagenet-boxes", "LOC_*.txt"),
                                              ("davis", "ImageSets/2017/*.txt"), ("davis", "Annotations/*/*/*.png"),
                                              ("spair", "PairAnnotation/*/*.json")])
def test_the_annotations_a_reader_reads_beside_its_images_are_signed(tmp_path, fmt, pattern):
    """Box files, the class mapping, a split's list, masks and pair annotations are part of the data."""
    root = synthesize(tmp_path / fmt, fmt, n=2, size=32, seed=0)
    before = data_fingerprint(as_source(f"{root}::{fmt}"))["digest"]
    annotation = sorted(root.glob(pattern))[0]
    st = annotation.stat()
    os.utime(annotation, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert data_fingerprint(as_source(f"{root}::{fmt}"))["digest"] != before


def test_a_dataset_whose_class_folders_are_links_signs_the_files_behind_them(tmp_path):
    store = synthesize(tmp_path / "store", "imagefolder", n=6, size=32, seed=0)
    linked = tmp_path / "linked"
    linked.mkdir()
    folders = sorted(p for p in store.iterdir() if p.is_dir())
    for folder in folders:
        os.symlink(folder, linked / folder.name)
    source = as_source(f"{linked}::imagefolder")
    before = data_fingerprint(source)
    assert before["num_files"] == len(source) == 6
    shutil.copy2(next(folders[0].iterdir()), folders[0] / "zz_new.png")
    after = data_fingerprint(as_source(f"{linked}::imagefolder"))
    assert after["num_files"] == 7 and after["digest"] != before["digest"]


def _signature_of(entry: tuple[str, int, int], root) -> tuple[str, int, int]:
    """The signature as ``pathlib`` spells the rule out: the file's resolved path relative to the resolved root
    (absolute when outside it), and the size and time of what it points to (-1 when there is none)."""
    from pathlib import Path

    path, root = Path(entry), Path(root)
    try:
        rel = path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        rel = path.resolve().as_posix()
    try:
        st = path.stat()
    except OSError:
        return rel, -1, -1
    return rel, st.st_size, st.st_mtime_ns


def test_links_moved_roots_and_missing_files_sign_as_the_resolved_paths_do(tmp_path):
    import hashlib

    from vitscope.data.fingerprint import stat_digest

    root = _folder(tmp_path / "root")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "e.png").write_bytes(b"abc")
    os.symlink(tmp_path / "elsewhere" / "e.png", root / "link.png")  # a link leaving the root
    os.symlink(root, tmp_path / "alias")  # a linked folder
    os.symlink(tmp_path / "nowhere.png", root / "dangling.png")
    paths = [str(root / "0.png"), str(tmp_path / "alias" / "1.png"), str(root / "link.png"), str(root / "dangling.png"),
             str(root / "missing.png")]
    for given_root in (root, tmp_path / "alias"):
        expected = [_signature_of(p, given_root) for p in paths]  # in the given order
        h = hashlib.sha256()
        for entry in expected:
            h.update(repr(entry).encode("utf-8"))
        assert stat_digest(paths, given_root) == (h.hexdigest(), len(paths))
    assert any(e[0] == "1.png" for e in expected) and any(e[1] == 3 for e in expected)  # resolved, and followed


def test_the_order_of_a_list_and_labels_given_in_memory_are_part_of_the_data(tmp_path):
    """Images are addressed by position (the feature cache's rows, a resumed run's next image), so a path list in
    another order, or other labels beside it, is another dataset; a folder keeps the digest of its sorted files."""
    import hashlib

    from vitscope.data.files import ImageFiles
    from vitscope.data.fingerprint import _Signatures
    from vitscope.data.memory import InMemoryImages

    root = _folder(tmp_path / "root")
    paths = sorted(str(p) for p in root.glob("*.png"))
    digests = {data_fingerprint(ImageFiles(ps, labels=ls))["digest"] for ps, ls in (
        (paths, None), (paths[::-1], None), (paths, [0] * len(paths)), (paths, [1] + [0] * (len(paths) - 1)))}
    assert len(digests) == 4
    assert data_fingerprint(ImageFiles(list(paths)))["digest"] == data_fingerprint(ImageFiles(paths))["digest"]
    signature, h = _Signatures(root), hashlib.sha256()
    for entry in sorted(signature(p) for p in paths):
        h.update(repr(entry).encode("utf-8"))
    assert data_fingerprint(as_source(str(root)))["digest"] == h.hexdigest()[:16]  # as before for a folder
    images = [np.zeros((8, 8, 3), dtype=np.uint8)] * 2
    assert data_fingerprint(InMemoryImages(images, labels=[0, 1]))["digest"] != \
        data_fingerprint(InMemoryImages(images, labels=[1, 0]))["digest"]


def test_a_command_stats_the_files_once_and_a_session_sees_changes(tmp_path, monkeypatch):
    from vitscope.data import fingerprint

    a = _folder(tmp_path / "a")
    source = as_source(str(a))
    calls = []
    real = fingerprint.stat_digest
    monkeypatch.setattr(fingerprint, "stat_digest", lambda *args: calls.append(1) or real(*args))
    with fingerprint.held_fingerprints():
        first = data_fingerprint(source)
        digest = first["digest"]
        first["digest"] = "changed by a caller"  # a copy: the held one stays
        with fingerprint.held_fingerprints():
            assert data_fingerprint(source)["digest"] == digest
    assert len(calls) == 1
    path = a / "1.png"
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert data_fingerprint(source)["digest"] != digest  # outside a command every call reads the files again
    assert len(calls) == 2


def test_extract_features_fingerprints_its_data_once(tmp_path, monkeypatch):
    import vitscope
    from vitscope.cache.feature_cache import FeatureCache
    from vitscope.cache.request import FeatureRequest
    from vitscope.data import fingerprint
    from vitscope.engine.extract import extract_features

    a = _folder(tmp_path / "a", n=4)
    calls = []
    real = fingerprint.stat_digest
    monkeypatch.setattr(fingerprint, "stat_digest", lambda *args: calls.append(1) or real(*args))
    extract_features(vitscope.load_model("tiny-vit"), as_source(str(a)), [FeatureRequest("resid_post", "cls")],
                     FeatureCache(tmp_path / "cache"), batch_size=2, device="cpu", resume=False, workers=0)
    assert len(calls) == 1
