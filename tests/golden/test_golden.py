"""The golden runs give the numbers committed before the engine-v2 redesign, number by number (1e-6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from golden.compare import differences
from golden.execute import run_golden, write_data
from golden.runs import RUNS, fixture
from golden.strict import not_json

QUICK = [r for r in RUNS if r.quick]


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_data(tmp_path_factory.mktemp("golden_data"), {k for r in QUICK for k in r.data})


@pytest.mark.parametrize("run", QUICK, ids=[r.name for r in QUICK])
def test_golden_run_matches_its_fixture(run, roots, tmp_path):
    actual = run_golden(run, roots, tmp_path / run.name)
    found = differences(fixture(run.name), actual, allow_extra=True, rtol=run.tolerance, atol=run.tolerance)
    assert not found, f"{run.name} moved:\n" + "\n".join(found)
    refused = not_json(tmp_path)  # every JSON file of the run (and of its feature cache), the report's JSON too
    assert not refused, "not JSON:\n" + "\n".join(refused)


def test_the_strict_check_refuses_nan_in_a_file_and_in_a_report(tmp_path):
    (tmp_path / "ok.json").write_text('{"a": null, "b": [1.5, "NaN"]}')
    assert not_json(tmp_path) == []
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "t.json").write_text('{"a": NaN}')
    (tmp_path / "report.html").write_text('<p>NaN</p><script type="application/json" class="vs-chart-data">'
                                          '{"v": [1, -Infinity]}</script>')
    assert [line.split(":")[0] for line in not_json(tmp_path)] == ["tables/t.json", "report.html"]


def test_comparison_finds_a_moved_number_a_missing_key_and_a_changed_label():
    expected = {"a": [1.0, 2.0, float("nan")], "b": {"c": "x", "n": 3}, "d": True}
    assert differences(expected, {"a": [1.0, 2.0 + 1e-9, float("nan")], "b": {"c": "x", "n": 3}, "d": True}) == []
    moved = differences(expected, {"a": [1.0, 2.001, 0.0], "b": {"c": "y"}, "d": 1})
    assert len(moved) == 5, moved  # 2.001, nan vs 0, missing n, label x -> y, True -> 1
    assert differences({"a": 1}, {"a": 1, "z": 2}) and not differences({"a": 1}, {"a": 1, "z": 2}, allow_extra=True)
    # a fixture's NaN is the null that strict JSON writes; the other way round, and null for a number, differ
    assert differences({"a": [float("nan"), float("inf")]}, {"a": [None, None]}) == []
    assert len(differences({"a": [None, 1.0]}, {"a": [float("nan"), None]})) == 2


def test_clustering_purity_may_move_by_one_image_and_no_more():
    expected = {"curves": {"clustering_purity": {"m": {"values": [0.614, 0.5]}}, "knn": [0.614]}}
    one_image = {"curves": {"clustering_purity": {"m": {"values": [0.612, 0.5]}}, "knn": [0.614]}}
    assert differences(expected, one_image) == []
    assert len(differences(expected, {"curves": {"clustering_purity": {"m": {"values": [0.604, 0.5]}},
                                                 "knn": [0.612]}})) == 2  # three images; another key: exact
