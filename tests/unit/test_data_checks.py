"""Degenerate data seen by the analyses themselves (issue 34 item 2): the rows an accumulator kept are checked at
``compute()`` (merge-exact: a one-class shard is refused alone, not merged with another class), and the labels
checked before a pass are read from the listing of a dataset, never from its images."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from contract.fake_records import fake_record, fake_spec
from vitscope.analyses.probes.clustering import Clustering
from vitscope.analyses.probes.knn import KnnProbe
from vitscope.analyses.probes.linear import LinearProbe
from vitscope.data.annotated_source import AnnotatedSource
from vitscope.data.formats.coco import CocoDataset
from vitscope.data.formats.imagefolder import ImageFolderDataset
from vitscope.data.formats.partimagenet import PartImageNetDataset
from vitscope.data.synthetic.write import synthesize


def _fed(acc, labels: list[int], start: int = 0):
    """``acc`` after one fake batch whose images (dataset positions from ``start``) have ``labels``."""
    spec = fake_spec()
    record, batch = fake_record(spec, acc.required_hooks(spec), len(labels), torch.Generator().manual_seed(start),
                                start_index=start)
    batch.targets = {"label": list(labels)}
    acc.update(record, batch)
    return acc


@pytest.mark.parametrize("cls", [KnnProbe, LinearProbe, Clustering])
def test_rows_of_one_class_give_no_numbers_but_the_reason(cls) -> None:
    with pytest.warns(UserWarning, match=r"the data with 1 class \(0\): k-NN, linear probes and clustering need at "
                                         "least two classes"):
        res = _fed(cls(), [0] * 12).compute()
    assert res.tensors == {} and "need at least two classes" in res.meta["error"]


def test_a_one_class_shard_merged_with_another_class_is_scored() -> None:
    """The check runs on the merged rows: each rank's (or resumed part's) share may hold one class."""
    a, b = _fed(KnnProbe(), [0] * 12), _fed(KnnProbe(), [1] * 12, start=12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = a.merge(b).compute()
    assert res["accuracy"].shape == (fake_spec().num_blocks,) and "error" not in res.meta


def test_a_split_without_test_images_gives_no_accuracy() -> None:
    # positions 0-2 are all kept for training at the default test fraction (0.2) and seed (0)
    with pytest.warns(UserWarning, match="3 labelled images cannot be split into train and test"):
        res = _fed(KnnProbe(), [0, 0, 1]).compute()
    assert res.tensors == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "purity" in _fed(Clustering(), [0, 0, 1]).compute().tensors  # clustering holds nothing out


def _strip_areas(root) -> None:
    path = root / "annotations" / "instances_val2017.json"
    doc = json.loads(path.read_text())
    for ann in doc["annotations"]:
        ann.pop("area", None)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("areas", [True, False], ids=["area-field", "mask-area"])
def test_coco_labels_from_the_annotation_file_are_the_items_labels(tmp_path, areas) -> None:
    root = synthesize(tmp_path / "coco", "coco", n=8, size=32, seed=0)
    if not areas:
        _strip_areas(root)
    ds = CocoDataset(root)
    expected = [-1 if ds[i].label is None else ds[i].label for i in range(len(ds))]
    assert ds.labels.tolist() == expected and len(set(expected)) > 1
    parts = PartImageNetDataset(synthesize(tmp_path / "parts", "partimagenet", n=8, size=32, seed=1), "train")
    assert parts.labels.tolist() == [-1 if parts[i].label is None else parts[i].label for i in range(len(parts))]


def test_the_labels_checked_before_a_pass_open_no_image(tmp_path) -> None:
    root = synthesize(tmp_path / "folder", "imagefolder", n=6, size=32, seed=0, num_classes=2)
    reader = ImageFolderDataset(root)
    expected = [label for _, label in reader.samples]
    reader.samples[0][0].unlink()  # a file gone after listing: skipped when read, its label still listed
    assert AnnotatedSource(reader).labels().tolist() == expected
