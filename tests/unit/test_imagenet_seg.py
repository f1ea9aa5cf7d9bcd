"""The ImageNet segmentation benchmark's file, on a file of the same structure the test writes (MATLAB v7.3 keeps
arrays column-major and the masks behind a second reference)."""

from __future__ import annotations

import numpy as np
import pytest

from vitscope.data.formats.common import DatasetFileNotFoundError, DatasetFormatError
from vitscope.data.formats.imagenet_seg import ImagenetSegmentation

h5py = pytest.importorskip("h5py")


def write_gtsegs(path, images, masks) -> None:
    with h5py.File(path, "w") as f:
        refs = f.create_group("#refs#")
        img_refs = np.empty((len(images), 1), dtype=h5py.ref_dtype)
        gt_refs = np.empty((len(images), 1), dtype=h5py.ref_dtype)
        for i, (image, mask) in enumerate(zip(images, masks)):
            img_refs[i, 0] = refs.create_dataset(f"img{i}", data=image.transpose(2, 1, 0)).ref
            inner = refs.create_dataset(f"gt{i}", data=mask.astype(np.uint8).transpose(1, 0)).ref
            holder = np.empty((1, 1), dtype=h5py.ref_dtype)
            holder[0, 0] = inner
            gt_refs[i, 0] = refs.create_dataset(f"gtcell{i}", data=holder).ref
        f.create_dataset("/value/img", data=img_refs)
        f.create_dataset("/value/gt", data=gt_refs)


def test_images_and_masks_come_back_as_written(tmp_path):
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 255, (h, w, 3), dtype=np.uint8) for h, w in [(6, 9), (8, 5)]]
    masks = [rng.random(im.shape[:2]) > 0.5 for im in images]
    write_gtsegs(tmp_path / "gtsegs_ijcv.mat", images, masks)
    data = ImagenetSegmentation(tmp_path / "gtsegs_ijcv.mat")
    assert len(data) == 2
    for i in range(2):
        image, mask = data[i]
        assert np.array_equal(image, images[i]) and np.array_equal(mask, masks[i])
    assert np.array_equal(data[-1][0], images[1])
    with pytest.raises(IndexError):
        data[2]


def test_a_wrong_file_is_one_clear_line(tmp_path):
    with pytest.raises(DatasetFileNotFoundError, match="gtsegs_ijcv.mat"):
        ImagenetSegmentation(tmp_path / "missing.mat")
    (tmp_path / "text.mat").write_text("not hdf5")
    with pytest.raises(DatasetFormatError, match="not an HDF5"):
        ImagenetSegmentation(tmp_path / "text.mat")
    with h5py.File(tmp_path / "other.mat", "w") as f:
        f.create_dataset("x", data=np.zeros(3))
    with pytest.raises(DatasetFormatError, match="no /value/img"):
        ImagenetSegmentation(tmp_path / "other.mat")


def test_the_benchmark_scores_every_method_on_the_file(tmp_path):
    """``vitscope explanations --data gtsegs_ijcv.mat``: pixel accuracy, mIoU and mAP per method."""
    from vitscope.workflows.explanations import run_explanations

    rng = np.random.default_rng(1)
    images = [rng.integers(0, 255, (70, 90, 3), dtype=np.uint8) for _ in range(3)]
    masks = [np.zeros((70, 90), dtype=bool) for _ in range(3)]
    for m in masks:
        m[20:50, 30:70] = True
    write_gtsegs(tmp_path / "gtsegs_ijcv.mat", images, masks)
    doc = run_explanations(["tiny-vit-sup"], str(tmp_path / "gtsegs_ijcv.mat"), tmp_path / "out",
                           ["rollout", "input_x_gradient"], limit=3)
    rows = doc["analyses"]["explanations"]["summary"]["rows"]
    assert {(r["method"], r["metric"]) for r in rows} == {(m, k) for m in ("rollout", "input_x_gradient")
                                                          for k in ("pixel_accuracy", "miou", "map")}
    assert all(0.0 <= r["value"] <= 1.0 for r in rows)


def test_a_metric_net_is_refused_in_one_line_before_any_model_is_scored(tmp_path):
    """A metric-learning net's linear head projects its embedding: there is no predicted class to explain. Listed
    after a classifier, it was refused once the classifier had been scored, and the folder was left behind."""
    from vitscope.errors import VitscopeValueError
    from vitscope.workflows.explanations import run_explanations

    write_gtsegs(tmp_path / "gtsegs_ijcv.mat", [np.zeros((8, 8, 3), dtype=np.uint8)], [np.ones((8, 8), dtype=bool)])
    said = []
    with pytest.raises(VitscopeValueError, match="tiny-vit-metric is a metric-learning net") as err:
        run_explanations(["tiny-vit-sup", "tiny-vit-metric"], str(tmp_path / "gtsegs_ijcv.mat"), tmp_path / "out",
                         ["rollout"], log=said.append)
    assert "\n" not in str(err.value)
    assert not [line for line in said if "images 0-" in line]  # nothing scored
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("given", [{"steps": 999}, {"sanity": False}])
def test_options_the_segmentation_benchmark_does_not_run_are_refused(tmp_path, given):
    """--steps and --sanity were accepted and ignored (--steps 999 too), and not recorded."""
    from vitscope.errors import VitscopeUsageError
    from vitscope.workflows.explanations import run_explanations

    write_gtsegs(tmp_path / "gtsegs_ijcv.mat", [np.zeros((8, 8, 3), dtype=np.uint8)], [np.ones((8, 8), dtype=bool)])
    with pytest.raises(VitscopeUsageError, match="--steps and --sanity .* does not run"):
        run_explanations(["tiny-vit-sup"], str(tmp_path / "gtsegs_ijcv.mat"), tmp_path / "out", ["rollout"], **given)
    assert not (tmp_path / "out").exists()


def test_missing_or_unreadable_segmentation_data_leaves_no_folder(tmp_path):
    from vitscope.workflows.explanations import run_explanations

    (tmp_path / "bad.mat").write_text("not hdf5")
    for name in ("nope.mat", "bad.mat"):
        with pytest.raises((DatasetFileNotFoundError, DatasetFormatError)):
            run_explanations(["tiny-vit-sup"], str(tmp_path / name), tmp_path / "out", ["rollout"])
        assert not (tmp_path / "out").exists()
