"""Rows spilled to disk go when no one can read them again, not at the process's exit: a notebook or a sweep
calling ``vitscope.run`` (or failing in it) many times filled the temporary folder (1.8 GB a call for k-NN rows of
50,000 images), and a feature extraction failing before its first save left its rows in the cache for good."""

from __future__ import annotations

import os

import pytest

import vitscope
from helpers.failing import FailingAnalysis
from vitscope.cache.row_folders import private_folder
from vitscope.cache.rowstore import RowStore

pytestmark = pytest.mark.usefixtures("one_thread")


def _spilled() -> int:
    return sum(len(files) for _, _, files in os.walk(private_folder()))


@pytest.fixture
def spill_every_row(monkeypatch):
    monkeypatch.setattr(RowStore.__init__, "__defaults__", (None, 1))  # every batch's rows go to disk


@pytest.mark.usefixtures("spill_every_row")
def test_a_run_and_a_failed_run_leave_no_spilled_rows(tmp_path) -> None:
    from vitscope.data.synthetic.write import synthesize

    backbone = vitscope.load_model("tiny-vit-sup")
    data = f"{synthesize(tmp_path / 'world', 'imagefolder', n=8, size=32, seed=0)}::imagefolder"
    before = _spilled()
    for _ in range(3):
        results = vitscope.run(backbone, data, "knn_probe", batch_size=2, progress=False, workers=0)
        assert results["knn_probe"].tensors  # computed from the rows before they went
        assert _spilled() == before
    probe = vitscope.analyses.registry.get_analysis("knn_probe")
    for _ in range(3):
        with pytest.raises(RuntimeError, match="failed at the second batch"):
            vitscope.run(backbone, data, [probe, FailingAnalysis(2, "failed at the second batch")], batch_size=2,
                         progress=False, workers=0)
        assert _spilled() == before


@pytest.mark.usefixtures("spill_every_row")
def test_a_feature_pass_failing_before_its_first_save_leaves_no_rows_in_the_cache(tmp_path) -> None:
    from vitscope.cache.feature_cache import FeatureCache
    from vitscope.cache.request import FeatureRequest
    from vitscope.data.synthetic.write import synthesize
    from vitscope.engine.extract import extract_features

    root = synthesize(tmp_path / "world", "imagefolder", n=8, size=32, seed=0)
    sorted(root.rglob("*.png"))[-1].write_bytes(b"not an image")  # read last, in a later batch than the first
    cache = FeatureCache(tmp_path / "cache")
    for _ in range(2):  # a retry added its rows beside the orphaned ones
        with pytest.raises(Exception, match="not an image|cannot identify|cannot read"):
            extract_features(vitscope.load_model("tiny-vit"), f"{root}::imagefolder", [FeatureRequest()], cache,
                             batch_size=2, workers=0, strict=True, progress=False)
        left = tmp_path / "cache" / "tmp"
        assert not left.exists() or not any(left.rglob("*")), sorted(left.rglob("*"))


@pytest.mark.usefixtures("spill_every_row")
def test_rows_a_copy_reads_stay_when_the_instance_runs_again(tmp_path) -> None:
    """Resetting an analysis for its next run deleted the rows its state_dict copies and merges still read."""
    from vitscope.analyses.registry import get_analysis
    from vitscope.data.synthetic.write import synthesize

    backbone = vitscope.load_model("tiny-vit-sup")
    data = f"{synthesize(tmp_path / 'world', 'imagefolder', n=8, size=32, seed=0)}::imagefolder"
    probe, merged = get_analysis("knn_probe"), get_analysis("knn_probe")
    first = vitscope.run(backbone, data, [probe], batch_size=2, progress=False, workers=0)["knn_probe"]
    snapshot = probe.state_dict()
    merged.merge(probe)
    vitscope.run(backbone, data, [probe], batch_size=2, progress=False, workers=0)  # reset, then a run of its own
    again = get_analysis("knn_probe")
    again.load_state_dict(snapshot)
    for copy in (again, merged):
        result = copy.result()
        assert result.tensors.keys() == first.tensors.keys()
        for key, tensor in result.tensors.items():
            assert (tensor == first.tensors[key]).all(), key


@pytest.mark.usefixtures("spill_every_row")
@pytest.mark.parametrize("call", ["analyze", "run_tiled"])
def test_analyze_and_tiled_runs_leave_no_spilled_rows(tmp_path, call) -> None:
    """They make the analyses they are named and hand run instances, which it then left alone."""
    from vitscope.data.synthetic.write import synthesize
    from vitscope.engine.tiling import run_tiled

    backbone = vitscope.load_model("tiny-vit-sup")
    data = f"{synthesize(tmp_path / 'world', 'imagefolder', n=8, size=32, seed=0)}::imagefolder"
    before = _spilled()
    for _ in range(2):
        if call == "analyze":
            vitscope.analyze(backbone, data, "knn_probe", batch_size=4, workers=0, progress=False)
        else:
            run_tiled(backbone, data, ["knn_probe"], batch_size=4, workers=0, progress=False)
        assert _spilled() == before
