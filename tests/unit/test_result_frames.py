"""The Python results (issue 34, item 9): ``in`` works on a result, ``to_frame`` names its dimensions (block,
head, ...) with integer labels, and the CSV tables the writer writes use the same names."""

from __future__ import annotations

import csv

import pandas as pd
import pytest
import torch

import vitscope
from helpers.cli import cli
from helpers.images import random_pngs
from vitscope.analyses import AttentionDistance
from vitscope.analyses.result import Result
from vitscope.errors import VitscopeKeyError


@pytest.fixture(scope="module")
def distance(tmp_path_factory):
    folder = random_pngs(tmp_path_factory.mktemp("imgs"), [(64, 64)] * 3)
    return vitscope.run(vitscope.load_model("tiny-vit"), str(folder), [AttentionDistance()], batch_size=2,
                        progress=False)["attention_distance"]


def test_in_works_on_a_result_of_a_run(distance) -> None:
    assert "block_mean" in distance and "distance" in distance
    assert "nope" not in distance and 0 not in distance
    assert set(distance.keys()) == {"distance", "block_mean", "random_distance", "random_block_mean"}


def test_to_frame_of_a_blocks_by_heads_tensor_names_its_axes_with_integer_labels(distance) -> None:
    frame = distance.to_frame("distance")
    assert frame.index.name == "block" and frame.columns.name == "head"
    assert list(frame.index) == list(range(6)) and list(frame.columns) == list(range(4))
    assert pd.api.types.is_integer_dtype(frame.index) and pd.api.types.is_integer_dtype(frame.columns)
    assert frame.loc[2, 3] == pytest.approx(distance["distance"][2, 3].item())
    per_block = distance.to_frame("block_mean")
    assert per_block.index.name == "block" and list(per_block.columns) == ["block_mean"]
    with pytest.raises(VitscopeKeyError, match="has no tensor 'nope'"):
        distance.to_frame("nope")


def test_the_long_table_has_one_column_per_dimension_name(distance) -> None:
    table = distance.to_frame()
    assert list(table.columns) == ["quantity", "block", "head", "value"]
    assert table["block"].dtype.kind == "i"  # Int64: integers with gaps
    per_block = table[table.quantity == "block_mean"]
    assert per_block["head"].isna().all() and list(per_block["block"]) == list(range(6))


def test_labels_come_from_the_metadata_and_declarations_fall_back_to_positions() -> None:
    class Twin(Result):
        DIMS = {"*_map": ("image", "row", "column"), "score": ("block", "head")}

    result = Twin("twin", {"score": torch.zeros(2, 3), "a_map": torch.zeros(2, 2, 2), "odd": torch.zeros(2, 2),
                           "score_vector": torch.zeros(4)}, {"blocks": [4, 7], "image_indices": [10, 3, 5]})
    frame = result.to_frame("score")
    assert list(frame.index) == [4, 7] and frame.index.name == "block"  # the blocks the analysis ran on
    assert result.dims("odd") == ("dim0", "dim1")  # no declaration
    assert result.dims("a_map") == ("image", "row", "column") and result.dim_labels("a_map")[0] == [0, 1]  # 3 names
    maps = result.to_frame("a_map")
    assert maps.index.names == ["image", "row"] and maps.columns.name == "column" and maps.shape == (4, 2)
    own = Result("own", {"x": torch.zeros(2, 5)}, {"dims": {"x": ["layer", "unit"]}})
    assert own.to_frame("x").columns.name == "unit"  # a result's own declaration, e.g. from a plain dict


def test_the_csv_tables_of_analyze_use_the_dimension_names(tmp_path) -> None:
    folder = random_pngs(tmp_path / "imgs", [(64, 64)] * 2)
    result = cli("analyze", "--model", "tiny-vit", "--data", str(folder), "--out", str(tmp_path / "out"),
                 "--analyses", "attention_distance,attention_stats", "--device", "cpu", "--no-resume")
    assert result.returncode == 0, result.stdout
    for name in ("attention_distance", "attention_stats"):
        with (tmp_path / "out" / "tables" / f"{name}.csv").open() as f:
            rows = list(csv.DictReader(f))
        assert list(rows[0]) == ["quantity", "block", "head", "value"]
        assert {r["block"] for r in rows} == {str(b) for b in range(6)}  # integers, not 0.0, 1.0
