"""The ImageNet boxes reader on the ILSVRC release's own layout: flat validation images labelled by
``LOC_val_solution.csv``, flat XML folders, XMLs of another image size, and the errors that say what to fix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vitscope.data.formats.common import DatasetFileNotFoundError, DatasetFormatError, save_jpeg
from vitscope.data.formats.imagenet_boxes import ImageNetBoxesDataset
from vitscope.data.load import load_dataset

MAPPING = "n01440764 tench, Tinca tinca\nn01443537 goldfish, Carassius auratus\n"


def _xml(name: str, width: int, height: int, *boxes: tuple[str, int, int, int, int]) -> str:
    objects = "".join(f"<object><name>{w}</name><bndbox><xmin>{a}</xmin><ymin>{b}</ymin><xmax>{c}</xmax>"
                      f"<ymax>{d}</ymax></bndbox></object>" for w, a, b, c, d in boxes)
    return (f"<annotation><filename>{name}</filename><size><width>{width}</width><height>{height}</height>"
            f"<depth>3</depth></size>{objects}</annotation>")


def _release(root: Path) -> Path:
    """A two-image ILSVRC validation split (flat images and XMLs, as released) and one train image."""
    (root / "LOC_synset_mapping.txt").write_text(MAPPING, encoding="utf-8")
    (root / "LOC_val_solution.csv").write_text(
        "ImageId,PredictionString\n"
        "ILSVRC2012_val_00000002,n01443537 3 1 8 6 n01443537 1 1 2 2 \n"
        "ILSVRC2012_val_00000001,n01440764 1 1 10 20 \n", encoding="utf-8")
    images, xmls = root / "ILSVRC" / "Data" / "CLS-LOC", root / "ILSVRC" / "Annotations" / "CLS-LOC"
    for n in (1, 2):
        save_jpeg(np.zeros((20, 25, 3), np.uint8), images / "val" / f"ILSVRC2012_val_0000000{n}.JPEG")
    (xmls / "val").mkdir(parents=True)
    (xmls / "val" / "ILSVRC2012_val_00000002.xml").write_text(
        _xml("ILSVRC2012_val_00000002", 25, 20, ("n01443537", 3, 1, 8, 6), ("n01443537", 1, 1, 2, 2)))
    save_jpeg(np.zeros((20, 25, 3), np.uint8), images / "train" / "n01440764" / "n01440764_18.JPEG")
    (xmls / "train" / "n01440764").mkdir(parents=True)
    (xmls / "train" / "n01440764" / "n01440764_18.xml").write_text(
        _xml("n01440764_18", 25, 20, ("n01440764", 1, 3, 10, 20)))
    return root


def test_the_release_validation_split_is_labelled_by_its_solution_file_and_boxed_by_its_flat_xmls(tmp_path):
    ds = load_dataset(_release(tmp_path), split="val")
    assert type(ds) is ImageNetBoxesDataset and ds.flat
    assert [Path(i.image_path).name for i in ds] == ["ILSVRC2012_val_00000001.JPEG", "ILSVRC2012_val_00000002.JPEG"]
    assert ds.labels.tolist() == [0, 1]
    assert ds[0].boxes.shape == (0, 4) and ds[0].meta["box_file"] is None  # its XML is not shipped here
    np.testing.assert_array_equal(ds[1].boxes, [[2, 0, 8, 6], [0, 0, 2, 2]])  # 1-based inclusive -> [x1, x2)
    assert ds[1].meta["box_file"].endswith("ILSVRC2012_val_00000002.xml")


def test_the_release_train_split_reads_its_class_folders_of_images_and_xmls(tmp_path):
    ds = ImageNetBoxesDataset(_release(tmp_path))
    assert not ds.flat and ds.labels.tolist() == [0]
    np.testing.assert_array_equal(ds[0].boxes, [[0, 2, 10, 20]])


def test_boxes_are_scaled_to_an_image_smaller_than_the_one_its_xml_names(tmp_path):
    root = _release(tmp_path)
    xml = root / "ILSVRC" / "Annotations" / "CLS-LOC" / "val" / "ILSVRC2012_val_00000002.xml"
    xml.write_text(_xml("ILSVRC2012_val_00000002", 50, 80, ("n01443537", 3, 1, 8, 6)))  # image on disk: 25 x 20
    np.testing.assert_allclose(ImageNetBoxesDataset(root, "val")[1].boxes, [[1, 0, 4, 1.5]])


def test_a_flat_xml_folder_serves_class_folders_of_images(tmp_path):
    (tmp_path / "LOC_synset_mapping.txt").write_text(MAPPING, encoding="utf-8")
    save_jpeg(np.zeros((20, 25, 3), np.uint8), tmp_path / "train" / "n01443537" / "n01443537_7.JPEG")
    (tmp_path / "boxes").mkdir()
    (tmp_path / "boxes" / "n01443537_7.xml").write_text(_xml("n01443537_7", 25, 20, ("n01443537", 1, 1, 5, 5)))
    np.testing.assert_array_equal(ImageNetBoxesDataset(tmp_path)[0].boxes, [[0, 0, 5, 5]])


def test_what_is_missing_is_named_with_the_way_to_fix_it(tmp_path):
    root = _release(tmp_path)
    with pytest.raises(DatasetFileNotFoundError, match="imagenet-boxes:SPLIT"):
        ImageNetBoxesDataset(root, "test")
    with pytest.raises(DatasetFileNotFoundError, match=r"box folder not found: .*elsewhere.*::imagefolder"):
        ImageNetBoxesDataset(root, "val", boxes_dir="elsewhere")
    (root / "LOC_val_solution.csv").write_text("ImageId,PredictionString\nILSVRC2012_val_00000001,n01440764 1 1 2 2\n")
    with pytest.raises(DatasetFormatError, match="no row for 1 image.*ILSVRC2012_val_00000002"):
        ImageNetBoxesDataset(root, "val")
    (root / "LOC_val_solution.csv").write_text("ImageId,PredictionString\nILSVRC2012_val_00000001,n09999999 1 1 2 2\n")
    with pytest.raises(DatasetFormatError, match="line 2: 'n09999999' is not a wnid"):
        ImageNetBoxesDataset(root, "val")
    (root / "LOC_val_solution.csv").unlink()
    with pytest.raises(DatasetFileNotFoundError, match="in no class folder .*LOC_val_solution.csv"):
        ImageNetBoxesDataset(root, "val")


def test_the_solution_file_is_part_of_the_data_fingerprint(tmp_path):
    from vitscope.data.annotated_source import reader_files

    files, _ = reader_files(ImageNetBoxesDataset(_release(tmp_path), "val"))
    assert files[-2:] == [str(tmp_path / "LOC_synset_mapping.txt"), str(tmp_path / "LOC_val_solution.csv")]
    assert str(tmp_path / "ILSVRC/Annotations/CLS-LOC/val/ILSVRC2012_val_00000002.xml") in files


def test_a_solution_file_saved_with_a_byte_order_mark_reads_the_same(tmp_path):
    root = _release(tmp_path)
    solution = root / "LOC_val_solution.csv"
    solution.write_text("\ufeff" + solution.read_text(encoding="utf-8"), encoding="utf-8")
    assert ImageNetBoxesDataset(root, "val").labels.tolist() == [0, 1]
