"""Hugging Face ``datasets`` where they live: ``save_to_disk`` folders (one split or a ``DatasetDict``), Parquet files
in the hub's ``imagenet-1k`` layout, and ``Dataset`` objects from Python. Images come from the encoded bytes of the
Image column, labels and class names from the ClassLabel column; nothing is downloaded and the fingerprint reads
no image."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

datasets = pytest.importorskip("datasets")

import vitscope  # noqa: E402
from helpers.cli import analyze_and_probe, cli  # noqa: E402
from vitscope.data import as_source  # noqa: E402
from vitscope.data.formats.errors import DatasetFormatError  # noqa: E402
from vitscope.data.hf_datasets import open_hf  # noqa: E402
from vitscope.data.images import ImageLoadError  # noqa: E402

CLASSES = ["cat", "dog", "fox"]


def _png(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (24 + seed % 3, 28, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _dataset(n: int, offset: int = 0) -> datasets.Dataset:
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=CLASSES),
                                  "caption": datasets.Value("string")})
    rows = {"image": [{"bytes": _png(offset + i), "path": None} for i in range(n)],
            "label": [(offset + i) % 3 for i in range(n)], "caption": [f"img {i}" for i in range(n)]}
    return datasets.Dataset.from_dict(rows, features=features)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    _dataset(12).save_to_disk(str(root / "one"))
    datasets.DatasetDict({"train": _dataset(18), "validation": _dataset(12, 100)}).save_to_disk(str(root / "dict"))
    parquet = root / "imagenet" / "data"
    parquet.mkdir(parents=True)
    _dataset(10).to_parquet(str(parquet / "train-00000-of-00002.parquet"))
    _dataset(8, 10).to_parquet(str(parquet / "train-00001-of-00002.parquet"))
    _dataset(12, 100).to_parquet(str(parquet / "validation-00000-of-00001.parquet"))
    return root


def _pixels(image: Image.Image) -> bytes:
    return image.convert("RGB").tobytes()


def test_a_saved_split_reads_images_labels_and_class_names(saved) -> None:
    source = as_source(f"{saved / 'one'}::hf")
    assert len(source) == 12 and source.class_names == CLASSES
    assert source.labels().tolist() == [i % 3 for i in range(12)]
    assert source.targets(4) == {"label": 1}
    assert _pixels(source.load(5)) == _pixels(Image.open(io.BytesIO(_png(5))))
    assert source.describe()["label_column"] == "label" and source.describe()["format"] == "hf"


@pytest.mark.parametrize(("spec", "n", "first"), [("dict::hf", 12, 100), ("dict::hf:train", 18, 0),
                                                  ("imagenet::hf", 12, 100), ("imagenet::hf:train", 18, 0)])
def test_splits_of_a_dataset_dict_and_of_parquet_files(saved, spec, n, first) -> None:
    source = as_source(str(saved / spec))
    assert len(source) == n
    assert _pixels(source.load(0)) == _pixels(Image.open(io.BytesIO(_png(first))))
    assert source.labels()[:3].tolist() == [(first + i) % 3 for i in range(3)]
    if spec.startswith("imagenet") and n == 18:  # across the two files, row groups and all
        assert _pixels(source.load(13)) == _pixels(Image.open(io.BytesIO(_png(13))))


def test_an_unknown_split_names_the_splits(saved) -> None:
    with pytest.raises(DatasetFormatError, match="no split 'test'; its splits: train, validation"):
        as_source(f"{saved / 'dict'}::hf:test")
    with pytest.raises(DatasetFormatError, match="no split 'val'; its splits: train, validation"):
        as_source(f"{saved / 'imagenet'}::hf:val")


def test_the_fingerprint_reads_no_image(saved, monkeypatch) -> None:
    source = as_source(f"{saved / 'imagenet'}::hf:train")
    monkeypatch.setattr(type(source), "load", lambda self, i: (_ for _ in ()).throw(AssertionError("decoded")))
    first = source.fingerprint()
    assert first["num_files"] == 2 and first == as_source(f"{saved / 'imagenet'}::hf:train").fingerprint()
    assert first != as_source(f"{saved / 'imagenet'}::hf:validation").fingerprint()
    memory = as_source(_dataset(6))
    monkeypatch.setattr(type(memory), "load", lambda self, i: (_ for _ in ()).throw(AssertionError("decoded")))
    assert memory.fingerprint()["digest"] == as_source(_dataset(6)).fingerprint()["digest"]


def test_another_selection_of_the_same_files_is_another_dataset(saved) -> None:
    """``select`` (a subset, another order, a row twice) keeps a loaded dataset's Arrow files: its fingerprint
    follows ``datasets``' own, so the feature cache and resume never take one selection for another."""
    whole = datasets.load_from_disk(str(saved / "one"))
    digests = [as_source(d).fingerprint()["digest"] for d in (
        whole, whole.select(range(6)), whole.select(range(11, -1, -1)), whole.select([0] * 12))]
    assert len(set(digests)) == 4
    assert as_source(datasets.load_from_disk(str(saved / "one"))).fingerprint()["digest"] == digests[0]


def test_parquet_shards_in_a_configurations_folder_keep_their_splits(tmp_path) -> None:
    """The hub's ``<config>/<split>-00000-of-0000N.parquet`` (cifar10's ``plain_text/``): split by file name; one
    split in the folders of two configurations is refused rather than merged."""
    config = tmp_path / "cifar" / "plain_text"
    config.mkdir(parents=True)
    _dataset(10).to_parquet(str(config / "train-00000-of-00001.parquet"))
    _dataset(4, 100).to_parquet(str(config / "test-00000-of-00001.parquet"))
    assert len(as_source(f"{tmp_path / 'cifar'}::hf:train")) == 10
    assert len(as_source(f"{tmp_path / 'cifar'}::hf")) == 4  # test, as no validation split exists
    other = tmp_path / "cifar" / "other_config"
    other.mkdir()
    _dataset(3).to_parquet(str(other / "train-00000-of-00001.parquet"))
    with pytest.raises(DatasetFormatError, match="split 'train' in several folders .*other_config.*plain_text"):
        as_source(f"{tmp_path / 'cifar'}::hf")


def test_the_label_column_named_label_else_the_first_in_the_features_order(tmp_path) -> None:
    """CIFAR-100's features: img, fine_label (100 classes), coarse_label (20): the fine labels."""
    features = datasets.Features({"img": datasets.Image(),
                                  "fine_label": datasets.ClassLabel(names=[f"f{i}" for i in range(100)]),
                                  "coarse_label": datasets.ClassLabel(names=[f"c{i}" for i in range(20)])})
    rows = {"img": [{"bytes": _png(i), "path": None} for i in range(3)], "fine_label": [49, 33, 72],
            "coarse_label": [10, 10, 0]}
    source = as_source(datasets.Dataset.from_dict(rows, features=features))
    assert source.label_column == "fine_label" and len(source.class_names) == 100
    assert source.labels().tolist() == [49, 33, 72]


def test_a_missing_label_is_unlabelled_on_disk_and_in_parquet_alike(tmp_path) -> None:
    """A null in an integer column: Arrow to numpy made it NaN for Parquet files (labels() failed)."""
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=CLASSES)})
    ds = datasets.Dataset.from_dict({"image": [{"bytes": _png(i), "path": None} for i in range(4)],
                                     "label": [0, None, 2, 1]}, features=features)
    ds.save_to_disk(str(tmp_path / "disk"))
    (tmp_path / "pq" / "data").mkdir(parents=True)
    ds.to_parquet(str(tmp_path / "pq" / "data" / "train-00000-of-00001.parquet"))
    for root in ("disk", "pq"):
        source = as_source(f"{tmp_path / root}::hf")
        assert source.labels().tolist() == [0, -1, 2, 1], root
        assert source.targets(1) == {} and source.targets(2) == {"label": 2}, root


def test_a_dataset_object_from_python_runs_through_vitscope_run() -> None:
    backbone = vitscope.load_model("tiny-vit")
    results = vitscope.run(backbone, datasets.DatasetDict({"validation": _dataset(9)}), ["knn_probe"], batch_size=4,
                           progress=False)
    assert results.num_images == 9 and results["knn_probe"].meta["num_rows"] == 9


def test_an_undecodable_row_is_skipped_and_named(tmp_path) -> None:
    broken = _dataset(4).to_dict()
    broken["image"][2] = {"bytes": b"not an image", "path": None}
    features = _dataset(1).features
    datasets.Dataset.from_dict(broken, features=features).save_to_disk(str(tmp_path / "b"))
    results = vitscope.run(vitscope.load_model("tiny-vit"), f"{tmp_path / 'b'}::hf", ["attention_distance"],
                           batch_size=2, progress=False)
    assert results.num_images == 3 and [s.path for s in results.skipped] == ["b[2]"]
    broken["image"][3] = {"bytes": None, "path": str(tmp_path / "gone.png")}  # a row pointing at a file
    source = as_source(datasets.Dataset.from_dict(broken, features=features))
    with pytest.raises(ImageLoadError, match=r"\[3\]: the row holds no image bytes, and its path .*gone.png"):
        source.load(3)


def test_analyze_and_probe_read_parquet_files(saved, tmp_path) -> None:
    doc, probe = analyze_and_probe(f"{saved / 'imagenet'}::hf:train", tmp_path, "attention_distance,knn_probe")
    assert doc["num_images"] == 18 and doc["data"]["format"] == "hf"
    assert any(k.startswith("knn") for k in probe["analyses"]) and probe["data"]["format"] == "hf"


def test_probe_trains_on_one_split_and_tests_on_another(saved, tmp_path) -> None:
    """``--test-data`` with Hugging Face splits: the probe reads both as sources (it took them for dataset readers)."""
    run = cli("probe", "-m", "tiny-vit", "-d", f"{saved / 'dict'}::hf:train", "--test-data",
              f"{saved / 'dict'}::hf:validation", "-o", str(tmp_path), "-b", "6", "--no-resume", "--blocks", "-1")
    assert run.returncode == 0, run.stdout + run.stderr
    knn = json.loads((tmp_path / "results.json").read_text())["analyses"]["knn_cls"]["summary"]
    assert (knn["num_train"], knn["num_test"]) == (18, 12)


def test_a_single_dataset_takes_only_its_own_split(saved) -> None:
    with pytest.raises(DatasetFormatError, match=r"one dataset with no named split.*no split 'test'; leave out"):
        as_source(f"{saved / 'one'}::hf:test")
    named = _dataset(5)
    named._split = datasets.NamedSplit("train")  # as load_dataset(..., split="train") leaves it
    assert len(open_hf(named, split="train")) == 5
    with pytest.raises(DatasetFormatError, match="the split 'train'"):
        open_hf(named, split="validation")


@pytest.mark.parametrize("fmt", ["pandas", "arrow", "numpy", "torch"])
def test_any_output_format_of_an_object_reads_the_same(fmt) -> None:
    plain = as_source(_dataset(4))
    formatted = as_source(_dataset(4).with_format(fmt))
    assert formatted.labels().tolist() == [0, 1, 2, 0]
    assert [_pixels(formatted.load(i)) for i in range(4)] == [_pixels(plain.load(i)) for i in range(4)]


def test_parquet_files_named_by_their_split_alone(tmp_path) -> None:
    _dataset(6).to_parquet(str(tmp_path / "train.parquet"))
    _dataset(3, 50).to_parquet(str(tmp_path / "test.parquet"))
    assert len(as_source(f"{tmp_path}::hf:test")) == 3 and len(as_source(f"{tmp_path}::hf:train")) == 6


def test_a_first_row_without_a_label_leaves_the_data_labelled() -> None:
    """Row 0's label is -1: the source still gives ``label`` (its labels() lists the others'), so k-NN and probes
    are not refused as if the data had no labels."""
    from vitscope.analyses.data_checks import DataFacts

    ds = _dataset(7)
    source = as_source(datasets.Dataset.from_dict({**ds.to_dict(), "label": [-1, 0, 1, 2, 0, 1, 2]},
                                                  features=ds.features))
    assert source.targets(0) == {} and "label" in source.target_keys()
    assert DataFacts(source).class_problem() is None


def test_the_checks_and_sae_cards_name_the_classes_of_a_hf_dataset() -> None:
    """The class names are the source's own (the ClassLabel's): a HF source has no reader behind it."""
    from types import SimpleNamespace

    from vitscope.analyses.data_checks import DataFacts
    from vitscope.workflows.sae_cards import _names

    assert DataFacts(as_source(_dataset(3)), {"label"}).class_names == CLASSES
    result = SimpleNamespace(meta={"class_labels": [0, 2]})
    _names(result, as_source(_dataset(3)))
    assert result.meta["class_names"] == {"0": "cat", "2": "fox"}


def test_a_dataset_dict_object_of_several_splits_asks_for_one_split(tmp_path) -> None:
    """An object has no ``--data`` spec to name a split in: the message says to pass one split of it (a saved one
    is told the spec that names a split)."""
    several = datasets.DatasetDict({"train": _dataset(3), "extra": _dataset(2)})
    with pytest.raises(DatasetFormatError, match=r'holds the splits train, extra; pass one split of it, e.g. '
                                                 r'dd\["train"\]$'):
        as_source(several)
    several.save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(DatasetFormatError, match=r"choose one with --data .*saved::hf:SPLIT$"):
        as_source(f"{tmp_path / 'saved'}::hf")


@pytest.mark.parametrize("values,kind", [([0, 1, 2, 0], "int64"), (["cat", "dog", "fox", "cat"], "string")])
def test_a_label_column_that_is_not_a_class_label_says_how_to_cast_it(values, kind) -> None:
    """A plain int or string column named label read as 'no image labels' with advice to use another format."""
    from vitscope.analyses.data_checks import DataFacts

    plain = datasets.Dataset.from_dict({"image": [{"bytes": _png(i), "path": None} for i in range(4)],
                                        "label": values},
                                       features=datasets.Features({"image": datasets.Image(),
                                                                   "label": datasets.Value(kind)}))
    source = as_source(plain)
    said = DataFacts(source).class_problem()
    assert f"its column 'label' holds {kind} values, not a ClassLabel feature" in said
    assert "class_encode_column('label')" in said and "::partimagenet" in said
    with pytest.raises(ValueError, match=f"no image labels; its column 'label' holds {kind} values"):
        source.labels()
    assert as_source(_dataset(4)).label_advice is None


@pytest.mark.parametrize("spec", ["imagenet::hf", "one::hf"])
def test_without_the_datasets_package_every_layout_names_the_extra(saved, spec, monkeypatch) -> None:
    """Parquet files reached pyarrow first: without the extra installed, a ModuleNotFoundError called itself a bug."""
    for module in ("datasets", "pyarrow", "pyarrow.parquet"):
        monkeypatch.setitem(__import__("sys").modules, module, None)  # as if never installed
    with pytest.raises(DatasetFormatError, match=r"needs the datasets package: pip install 'vitscope\[hf\]'"):
        as_source(str(saved / spec))
