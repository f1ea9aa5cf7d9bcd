"""docs/errors.md, data an analysis cannot score: one class, one image per class, no labels, no train/test split,
one region class, no masks. ``analyze`` with the analysis named, ``probe``, ``vitscope.run`` and ``compare`` refuse
(or, in a default run, leave out) the same data in the same words."""

from __future__ import annotations

import json

import pytest

from helpers.bad_input import MODEL, copy_world, edit_json, finished, one_error
from helpers.cli import cli
from helpers.images import random_pngs

LABELLED = ("knn_probe", "linear_probe", "clustering")


def _classes(root, counts: dict[str, int]):
    """An imagefolder ``root/<class>/img<i>.png`` with ``counts[class]`` small random pictures per class."""
    for k, (name, n) in enumerate(counts.items()):
        random_pngs(root / name, [(24, 24)] * n, seed=k)
    return root


def _analyze(data, out, analyses):
    return cli("analyze", "-m", MODEL, "-d", str(data), "-o", str(out), "-a", analyses)


def _probe(data, out):
    return cli("probe", "-m", MODEL, "-d", str(data), "-o", str(out))


def _run(data, analyses) -> str:
    """The one-line refusal of ``vitscope.run`` (from Python) on ``data``."""
    import vitscope

    with pytest.raises(ValueError) as err:
        vitscope.run(vitscope.load_model(MODEL), data, analyses, device="cpu")
    assert type(err.value).__name__ == "DegenerateDataError" and "\n" not in str(err.value)
    return str(err.value)


@pytest.fixture(scope="module")
def one_class(tmp_path_factory):
    return _classes(tmp_path_factory.mktemp("one_class"), {"cats": 6})


@pytest.mark.parametrize("analysis", LABELLED)
def test_data_one_class(one_class, tmp_path, analysis):
    """The reported case: analyze --analyses knn_probe gave accuracy 1.0 and random accuracy 1.0."""
    data = f"{one_class}::imagefolder"
    said = one_error(_probe(data, tmp_path / "probe"), "imagefolder data with 1 class ('cats'): k-NN, linear probes "
                                                       "and clustering need at least two classes")
    assert one_error(_analyze(data, tmp_path / "analyze", analysis), "") == said
    assert f"error: {_run(data, [analysis])}" == said
    import vitscope

    with pytest.raises(ValueError) as err:  # the library call behind analyze, before any pass
        vitscope.analyze(MODEL, data, analysis, out=tmp_path / "library")
    assert f"error: {err.value}" == said
    assert not (tmp_path / "analyze" / "results.json").exists()


def test_data_one_image_per_class(tmp_path):
    data = f"{_classes(tmp_path / 'flat', {'a': 1, 'b': 1, 'c': 1})}::imagefolder"
    said = one_error(_probe(data, tmp_path / "probe"), "imagefolder data with 3 classes of one image each")
    for analysis in LABELLED:
        assert one_error(_analyze(data, tmp_path / analysis, analysis), "") == said


def test_data_without_labels_for_probes(tmp_path):
    photos = random_pngs(tmp_path / "photos", [(24, 24)] * 4)
    said = one_error(_analyze(photos, tmp_path / "out", "knn_probe"), "data 'photos' has no image labels: k-NN, "
                                                                      "linear probes and clustering need a class label")
    assert f"error: {_run(photos, ['clustering'])}" == said  # was a warning and an empty result


def test_data_too_few_images_to_split(tmp_path):
    # 3 images: the seeded hash holds none of positions 0-2 out at the default test fraction 0.2
    data = f"{_classes(tmp_path / 'few', {'a': 2, 'b': 1})}::imagefolder"
    said = one_error(_probe(data, tmp_path / "probe"), "3 labelled images cannot be split into train and test at a "
                                                       "test fraction of 0.2")
    for analysis in ("knn_probe", "linear_probe"):
        assert one_error(_analyze(data, tmp_path / analysis, analysis), "") == said
    finished(_analyze(data, tmp_path / "clustering", "clustering"), tmp_path / "clustering")  # holds nothing out


def test_data_without_masks_for_saliency(tmp_path):
    photos = random_pngs(tmp_path / "photos", [(24, 24)] * 2)
    said = one_error(_analyze(photos, tmp_path / "out", "saliency_iou"), "analysis 'saliency_iou' needs ground "
                                                                         "truth masks")
    assert f"error: {_run(photos, ['saliency_iou'])}" == said  # was another line, at the first batch


def test_annotations_one_region_class(coco_world, tmp_path):
    world = copy_world(coco_world, tmp_path / "world")

    def one_category(doc):
        for ann in doc["annotations"]:
            ann["category_id"] = doc["categories"][0]["id"]
    edit_json(world / "annotations" / "instances_val2017.json", one_category)
    said = one_error(_probe(f"{world}::coco", tmp_path / "probe"), "coco data with ")
    assert "annotated region(s) of 1 class(es) in " in said and "needs object masks of at least two classes" in said
    from vitscope.analyses.probes.clustering import Clustering
    from vitscope.data.annotated_source import AnnotatedSource
    from vitscope.data.load import load_dataset

    regions = AnnotatedSource(load_dataset(world, "coco"), regions=True)
    assert f"error: {_run(regions, [Clustering(level='object')])}" == said


def test_data_unscorable_in_a_default_run(one_class, tmp_path):
    """A default analyze leaves out what cannot score the data (with its reason) and runs the rest; compare leaves
    out its k-NN and clustering curves with the same reason as a note."""
    import vitscope
    from vitscope.analyses.data_checks import DataFacts
    from vitscope.analyses.registry import ANALYSES, why_cannot_run
    from vitscope.data.open import as_source
    from vitscope.workflows.analyze import choose_analyses

    data = f"{one_class}::imagefolder"
    said = one_error(_probe(data, tmp_path / "probe"), "need at least two classes")
    spec = vitscope.load_model(MODEL).spec
    facts = DataFacts(as_source(data))
    chosen = [a.name for a in choose_analyses(None, spec, facts.targets, data=facts)]
    assert chosen and not set(LABELLED) & set(chosen)
    assert {f"error: {why_cannot_run(ANALYSES[n](), spec, facts.targets, facts)}" for n in LABELLED} == {said}
    out = tmp_path / "compare"
    finished(cli("compare", "--models", f"{MODEL},tiny-vit-sup", "-d", data, "-o", str(out), "-b", "8"), out)
    notes = json.loads((out / "tables" / "compare.json").read_text())["notes"]
    assert f"error: {notes[0]}" == said and len(notes) == 1


def test_data_missing_or_refused_leaves_no_output_folder(tmp_path):
    """A run refused for its data (missing, or without what its analyses need) made --out first and left it empty."""
    photos = random_pngs(tmp_path / "photos", [(24, 24)] * 4)
    runs = {"unlabelled": ("analyze", "-m", MODEL, "-d", str(photos), "-a", "knn_probe"),
            "analyze": ("analyze", "-m", MODEL, "-d", f"{tmp_path}/nowhere::coco"),
            "compare": ("compare", "-M", f"{MODEL},tiny-vit-sup", "-d", f"{tmp_path}/nowhere::coco"),
            "artifacts": ("artifacts", "-m", MODEL, "-d", f"{tmp_path}/nowhere::coco", "--no-ablations"),
            "explanations": ("explanations", "-M", MODEL, "-d", f"{tmp_path}/nowhere::coco", "--methods", "rollout"),
            "probe_one_class": ("probe", "-m", MODEL, "-d", f"{_classes(tmp_path / 'one', {'cats': 3})}::imagefolder"),
            "probe_unlabelled": ("probe", "-m", MODEL, "-d", str(photos))}
    for name, args in runs.items():
        said = one_error(cli(*args, "-o", str(tmp_path / name)), "")
        expected = {"unlabelled": "no image labels", "probe_unlabelled": "data '" + str(photos) + "' has no image "
                    "labels", "probe_one_class": "with 1 class ('cats')"}.get(name, "does not exist")
        assert expected in said, said
        assert not (tmp_path / name).exists(), name
