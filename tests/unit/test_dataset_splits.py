"""Splits of real releases: ``ROOT::FORMAT:SPLIT`` picks one, and a root holding only a split other than the
reader's default (DAVIS test-dev downloaded alone, COCO 2014, a train-only COCO) is read at that split."""

from __future__ import annotations

import shutil

import pytest

from vitscope.data.formats.errors import DatasetFormatError
from vitscope.data.load import load_dataset, parse_data
from vitscope.data.open import as_source


@pytest.fixture(scope="module")
def coco_2017(tmp_path_factory):
    from vitscope.data.synthetic.write import synthesize

    root = tmp_path_factory.mktemp("coco")
    synthesize(root, "coco", n=3, size=32, seed=0)
    return root


def _as_split(coco_2017, root, *splits):
    (root / "annotations").mkdir(parents=True)
    for split in splits:
        annotations = coco_2017 / "annotations" / "instances_val2017.json"
        shutil.copy(annotations, root / "annotations" / f"instances_{split}.json")
        shutil.copytree(coco_2017 / "val2017", root / split)
    return root


def test_parse_data():
    assert parse_data("data/coco::coco") == ("data/coco", "coco", {})
    assert parse_data("data/coco::coco:val2014") == ("data/coco", "coco", {"split": "val2014"})
    assert parse_data("r::revisitop:rparis6k") == ("r", "revisitop", {"name": "rparis6k"})
    assert parse_data("photos::") == ("photos", None, {})
    with pytest.raises(DatasetFormatError, match="the imagefolder format takes no split"):
        parse_data("photos::imagefolder:train")


def test_coco_2014_alone_is_read_at_its_split(coco_2017, tmp_path):
    ds = load_dataset(_as_split(coco_2017, tmp_path / "c14", "val2014"), "coco")
    assert ds.name == "coco:val2014" and len(ds) == 3


def test_a_validation_split_is_preferred_and_a_named_split_wins(coco_2017, tmp_path):
    root = _as_split(coco_2017, tmp_path / "c", "train2014", "val2014")
    assert load_dataset(root, "coco").name == "coco:val2014"
    assert as_source(f"{root}::coco:train2014").name == "coco:train2014"


def test_several_splits_without_the_default_or_a_validation_one_are_named(coco_2017, tmp_path):
    root = _as_split(coco_2017, tmp_path / "c", "train2014", "test2015")
    with pytest.raises(DatasetFormatError, match=r"holds the coco splits test2015, train2014 and not val2017; "
                                                 r"choose one with --data .*::coco:SPLIT"):
        load_dataset(root, "coco")


def test_davis_test_dev_downloaded_alone(tmp_path):
    from vitscope.data.synthetic.write import synthesize

    root = synthesize(tmp_path / "davis", "davis", n=1, size=32, seed=0)
    sets = root / "ImageSets" / "2017"
    (sets / "val.txt").rename(sets / "test-dev.txt")
    for seq in (root / "Annotations" / "480p").iterdir():
        for png in sorted(seq.glob("*.png"))[1:]:
            png.unlink()
    ds = load_dataset(root, "davis")
    assert ds.name == "davis2017-test-dev" and ds.first_frame_only
    assert as_source(f"{root}::davis:test-dev").name == "davis2017-test-dev"
