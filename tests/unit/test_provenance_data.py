"""Every command's results.json describes its data with one key set: the format's id, the split where the format has
splits, the count, the root it was read from, the class names and where the labels come from."""

from __future__ import annotations

import shutil

import pytest

from vitscope.data.annotated_source import AnnotatedSource
from vitscope.data.files import ImageFiles
from vitscope.data.first_items import FirstItems
from vitscope.data.load import load_dataset
from vitscope.data.open import as_source
from vitscope.data.synthetic.write import synthesize


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    """A COCO and an ImageFolder copy of the synthetic world (6 images, 32 px each)."""
    root = tmp_path_factory.mktemp("prov_data")
    return {fmt: synthesize(root / fmt, fmt, n=6, size=32, seed=0) for fmt in ("coco", "imagefolder")}


def test_a_coco_source_names_its_format_split_classes_and_label_rule(worlds):
    reader = load_dataset(worlds["coco"], "coco")
    described = as_source(f"{worlds['coco']}::coco").describe()
    assert described["format"] == "coco" and described["split"] == "val2017"  # the default split, said
    assert described["source"] == str(worlds["coco"]) and described["num_files"] == len(reader)
    assert described["classes"] == reader.classes and len(described["classes"]) == 10
    assert "largest annotation" in described["label_rule"]


def test_an_image_folder_names_its_sorted_classes_and_no_split_even_cut_to_its_first_items(worlds):
    reader = load_dataset(worlds["imagefolder"], "imagefolder")
    described = AnnotatedSource(FirstItems(reader, 3)).describe()  # probe --limit 3
    assert described["format"] == "imagefolder" and "split" not in described and described["num_files"] == 3
    assert described["classes"] == sorted(described["classes"]) == reader.classes
    assert "sorted" in described["label_rule"]


def test_a_plain_folder_is_a_folder_without_labels_and_a_reader_of_ones_own_is_named_by_its_class(worlds, tmp_path):
    described = ImageFiles(worlds["imagefolder"]).describe()
    assert described["format"] == "folder" and described["label_rule"].startswith("none")
    assert ImageFiles([str(p) for p in sorted(worlds["imagefolder"].rglob("*.png"))][:2]).describe()["format"] == \
        "paths"

    class Mine(list):
        pass

    described = AnnotatedSource(Mine(load_dataset(worlds["imagefolder"], "imagefolder"))).describe()
    assert described["format"] == "reader" and described["reader"] == "Mine"


def test_a_named_list_numbers_its_names_in_sorted_order(worlds, tmp_path):
    for i, image in enumerate(sorted(worlds["imagefolder"].rglob("*.png"))[:3]):
        shutil.copy(image, tmp_path / f"{i}.png")
    listed = tmp_path / "pairs.txt"
    listed.write_text("0.png zebra\n1.png ant\n2.png zebra\n")
    described = as_source(str(listed)).describe()
    assert described["format"] == "list" and described["classes"] == ["ant", "zebra"]
    assert "sorted order" in described["label_rule"]


def test_probe_records_the_data_as_analyze_does(worlds):
    from vitscope.workflows.probe import _describe

    reader = load_dataset(worlds["imagefolder"], "imagefolder")
    probed = _describe(reader)
    analysed = as_source(f"{worlds['imagefolder']}::imagefolder").describe()
    assert "items" not in probed and probed["num_files"] == len(reader)
    assert {k: probed[k] for k in analysed} == analysed  # the same root, format, classes and rule
    assert probed["fingerprint"]["num_files"] == len(reader) and probed["decode"] == "full"
