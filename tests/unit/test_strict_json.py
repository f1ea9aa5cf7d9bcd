"""Strict JSON (issue 34, item 4): numbers that are not finite are written as null, every JSON output parses with
a parser that refuses NaN and Infinity, and a summary says why a value is null where the analysis knows."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from golden.strict import not_json, strict_loads
from vitscope.analyses.result import Figure, Result, SummaryResult
from vitscope.outputs import RunResult, write_run
from vitscope.strict_json import NULL_REASONS, dumps, finite, note_null, write_json_atomic
from vitscope.viz.charts import Chart, HeatPanel, block_lines_chart, curve


def test_finite_replaces_every_number_that_is_not_finite_and_keeps_the_rest() -> None:
    doc = {"a": [1.5, float("nan"), (float("inf"), -float("inf"))], "b": {"c": np.float32("nan"), "d": np.int64(3)},
           "e": True, "f": None, "g": "NaN", "h": 7, "i": np.float64(0.25)}
    assert finite(doc) == {"a": [1.5, None, [None, None]], "b": {"c": None, "d": 3}, "e": True, "f": None,
                           "g": "NaN", "h": 7, "i": 0.25}
    assert type(finite(doc)["b"]["d"]) is int
    text = dumps(doc, indent=1)
    assert strict_loads(text)["a"] == [1.5, None, [None, None]]
    assert math.isnan(doc["a"][1])  # the document itself is left as it was


def test_arrays_tensors_and_numpy_bools_are_written_as_their_values() -> None:
    doc = {"array": np.array([float("nan"), 1.0]), "tensor": torch.tensor([[2.0, float("inf")]]),
           "scalar": torch.tensor(3), "bool": np.bool_(True), "ints": np.arange(2, dtype=np.int16)}
    assert strict_loads(dumps(doc)) == {"array": [None, 1.0], "tensor": [[2.0, None]], "scalar": 3, "bool": True,
                                        "ints": [0, 1]}


def test_write_json_atomic_is_strict(tmp_path: Path) -> None:
    path = write_json_atomic(tmp_path / "x.json", {"v": float("nan")})
    assert strict_loads(path.read_text()) == {"v": None}


def _chart() -> Chart:
    heat = HeatPanel("head", "block", "score", ["0", "1"], ["0", "1"], [[0.5, None], [1.0, 0.25]],
                     value_range=(0.0, float("inf")))  # a range that is not finite reaches the JSON as null
    return Chart([heat, *block_lines_chart([curve("m", [0.1, float("nan")], "m")], "score", 2).panels])


def test_every_output_of_a_run_with_nan_parses_strictly_and_says_why(tmp_path: Path) -> None:
    meta = {"model": "m", "stages": {"early": 0.5, "late": float("nan")}}
    note_null(meta, "stages.late", "no block is in this stage")
    result = Result("thing", {"score": torch.tensor([0.5, float("nan"), float("inf")], dtype=torch.float64)}, meta)
    figure = Figure("thing_chart", lambda path: [], "Chart", "caption", chart=_chart())
    summary = SummaryResult("other", {"x": float("-inf")}, figures=[figure])
    run = RunResult("analyze", config={"model": "m", "limit": float("nan")}, results={"thing": result,
                    "other": summary}, models=[{"id": "m"}], extra={"extra": [float("nan")]})
    out = write_run(tmp_path / "out", run, progress=False).parent
    assert {p.name for p in out.rglob("*.json")} >= {"results.json", "thing.json", "other.json",
                                                     "thing_chart.json", ".vitscope-manifest.json"}
    assert not_json(out) == []
    doc = strict_loads((out / "results.json").read_text())
    entry = doc["analyses"]["thing"]["summary"]
    assert entry["score"] == [0.5, None, None]
    assert entry["stages"] == {"early": 0.5, "late": None}
    assert entry[NULL_REASONS] == {"stages.late": "no block is in this stage"}
    assert doc["analyses"]["other"]["summary"]["x"] is None and doc["extra"] == [None]
    assert strict_loads((out / "tables" / "thing.json").read_text())[NULL_REASONS] == entry[NULL_REASONS]
    chart = strict_loads((out / "charts" / "thing_chart.json").read_text())
    assert chart["panels"][0]["value_range"] == [0.0, None] and chart["panels"][1]["curves"][0]["values"] == [0.1, None]
    saved = result.save(tmp_path / "saved")
    assert not_json(tmp_path / "saved") == [] and len(saved) == 2


def test_the_reason_is_the_summary_s_and_is_shown_in_the_report(tmp_path: Path) -> None:
    meta: dict = {}
    note_null(meta, "mAP_easy", "no query has a positive under the easy protocol")
    result = Result("retrieval", {"mAP_easy": torch.tensor([float("nan")] * 2, dtype=torch.float64)}, meta)
    out = write_run(tmp_path / "out", RunResult("probe", results={"retrieval": result}), progress=False).parent
    assert "no query has a positive under the easy protocol" in (out / "report.html").read_text()
    assert json.loads((out / "results.json").read_text())["analyses"]["retrieval"]["summary"]["mAP_easy"] == [None,
                                                                                                             None]


def test_mapping_keys_of_numpy_torch_or_non_finite_numbers_are_written() -> None:
    """np.unique's counts keyed by numpy integers stopped the writer after a whole pass."""
    doc = {np.int64(3): 1.0, np.float32(0.5): 2, torch.tensor(7): 3, float("nan"): 4, "a": 5, 2: 6}
    assert json.loads(dumps(doc)) == {"3": 1.0, "0.5": 2, "7": 3, "nan": 4, "a": 5, "2": 6}
