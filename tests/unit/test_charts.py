"""Charts as data (vitscope.viz.charts), the report's pinned chart library, and how the writer uses both."""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
import torch

from vitscope.analyses.result import Figure, SummaryResult
from vitscope.outputs import RunResult, write_run
from vitscope.report.assets import ECHARTS_SHA256, ECHARTS_VERSION, chart_script, echarts_script
from vitscope.viz.charts import Chart, Curve, HeatPanel, block_head_chart, block_lines_chart, curve


def test_heat_map_keeps_every_value_in_place_and_blanks_non_finite_cells() -> None:
    m = torch.tensor([[0.5, float("nan")], [2.0, float("inf")], [-1.0, 3.25]], dtype=torch.float64)
    panel = block_head_chart(m, "nats", block_labels=[3, 7, 9], title="t").panels[0]
    assert panel.rows == ["3", "7", "9"] and panel.columns == ["0", "1"]
    assert panel.values == [[0.5, None], [2.0, None], [-1.0, 3.25]]
    assert (panel.x_label, panel.y_label, panel.value_label) == ("head", "block", "nats")


def test_heat_map_refuses_wrong_shapes_and_unknown_colours() -> None:
    with pytest.raises(ValueError, match=r"\[L, H\]"):
        block_head_chart(torch.zeros(2, 3, 4), "v")
    with pytest.raises(ValueError, match="labels for 2 rows"):
        block_head_chart(torch.zeros(2, 3), "v", block_labels=[0])
    with pytest.raises(ValueError, match="another shape"):
        HeatPanel("x", "y", "v", ["0", "1"], ["0"], [[1.0]])
    with pytest.raises(ValueError, match="colours 'jet'"):
        HeatPanel("x", "y", "v", ["0"], ["0"], [[1.0]], colours="jet")


def test_log_toggle_only_when_every_value_is_positive() -> None:
    positive = block_lines_chart([curve("a", [1.0, 2.0], "a"), curve("b", [[0.5, 0.1], [0.2, 0.3]], "a", "dots")],
                                 "v", 2)
    assert positive.panels[0].log_toggle
    with_zero = block_lines_chart([curve("a", [1.0, 0.0], "a")], "v", 2)
    assert not with_zero.panels[0].log_toggle


def test_dots_keep_several_values_per_tick_and_json_is_plain() -> None:
    per_head = np.array([[0.1, 0.2, 0.3], [0.4, float("nan"), 0.6]])
    chart = Chart(block_lines_chart([curve("m", per_head, "m", "dots"), curve("random", [0.2, 0.5], "", "dashed")],
                                    "distance", 2, block_labels=["b0", "b1"]).panels)
    doc = json.loads(json.dumps(chart.to_json(), allow_nan=False))  # no NaN may reach the page
    dots, dashed = doc["panels"][0]["curves"]
    assert dots["values"] == [[0.1, 0.2, 0.3], [0.4, None, 0.6]]
    assert dashed == {"name": "random", "values": [0.2, 0.5], "colour": "", "style": "dashed", "x": None,
                      "baseline": True}
    assert dots["baseline"] is False
    assert doc["panels"][0]["x_ticks"] == ["b0", "b1"] and doc["panels"][0]["kind"] == "lines"


def test_colour_keys_in_order_of_first_appearance_without_the_neutral_one() -> None:
    panels = block_lines_chart([Curve("b", [1.0], "b"), Curve("r", [1.0], ""), Curve("a", [1.0], "a"),
                                Curve("b again", [2.0], "b")], "v", 1).panels
    assert Chart(panels).colour_keys() == ["b", "a"]


def test_the_vendored_chart_library_is_the_pinned_release() -> None:
    raw = resources.files("vitscope.report").joinpath("vendor/echarts.min.js").read_bytes()
    assert hashlib.sha256(raw).hexdigest() == ECHARTS_SHA256
    assert f'"{ECHARTS_VERSION}"' in echarts_script()
    licence = resources.files("vitscope.report").joinpath("vendor/echarts-LICENSE.txt").read_text()
    assert "Apache License" in licence
    assert "echarts.init" in chart_script()


def _chart_figure(stem: str, drawn: list[str]) -> Figure:
    def draw(path: Path) -> list[Path]:
        drawn.append(stem)
        png = path.with_suffix(".png")
        png.parent.mkdir(parents=True, exist_ok=True)
        from PIL import Image

        Image.new("RGB", (4, 4), "white").save(png)
        return [png]

    chart = block_lines_chart([curve("m", [0.25, 0.5], "m")], "value", 2)
    return Figure(stem, draw, "A chart", "caption", chart=chart)


def _run(drawn: list[str]) -> RunResult:
    result = SummaryResult("thing", {"x": 1}, figures=[_chart_figure("thing_curve", drawn)])
    return RunResult("analyze", config={}, results={"thing": result}, models=[{"id": "m", "name": "m"}],
                     data={"name": "d"}, num_images=2)


def test_a_chart_is_written_as_json_and_drawn_by_the_browser_not_matplotlib(tmp_path) -> None:
    drawn: list[str] = []
    doc = json.loads(write_run(tmp_path / "out", _run(drawn), progress=False).read_text())
    assert drawn == []
    files = doc["analyses"]["thing"]["files"]["figures"]
    assert files == ["charts/thing_curve.json"]
    spec = json.loads((tmp_path / "out" / files[0]).read_text())
    assert spec["panels"][0]["curves"][0]["values"] == [0.25, 0.5]
    html = (tmp_path / "out" / "report.html").read_text()
    assert 'data-chart data-stem="thing_curve"' in html and "echarts.init" in html
    assert html.count("vs-chart-data") == 2  # the figure's JSON and the script that reads it
    assert not (tmp_path / "out" / "figures").exists()


def test_figure_files_draws_the_chart_figures_too(tmp_path) -> None:
    drawn: list[str] = []
    doc = json.loads(write_run(tmp_path / "out", _run(drawn), progress=False, figure_files=True).read_text())
    assert drawn == ["thing_curve"]
    assert doc["analyses"]["thing"]["files"]["figures"] == ["figures/thing_curve.png", "charts/thing_curve.json"]
    assert "data-chart" in (tmp_path / "out" / "report.html").read_text()  # the report still shows the chart


def test_a_report_without_charts_carries_no_chart_library(tmp_path) -> None:
    result = SummaryResult("plain", {"x": 1})
    write_run(tmp_path / "out", RunResult("analyze", results={"plain": result}), progress=False)
    html = (tmp_path / "out" / "report.html").read_text()
    assert "echarts" not in html and len(html) < 200_000


def test_a_damaged_chart_library_fails_before_the_pass(tmp_path, monkeypatch) -> None:
    from vitscope.errors import VitscopeRuntimeError
    from vitscope.outputs import prepare_output
    from vitscope.report import assets

    monkeypatch.setattr(assets, "ECHARTS_SHA256", "0" * 64)
    assets.echarts_script.cache_clear()
    try:
        with pytest.raises(VitscopeRuntimeError, match="is not ECharts 6.1.0 as pinned"):
            prepare_output(tmp_path / "out")
    finally:
        assets.echarts_script.cache_clear()


def test_residual_paths_are_a_two_panel_chart_with_the_numbers_of_the_result() -> None:
    import torch

    from vitscope.analyses.representation.residual import ResidualResult

    t = {"attn_cka": torch.tensor([0.9, 0.5, 0.2]), "mlp_cka": torch.tensor([0.8, 0.6, 0.4]),
         "attn_norm_ratio": torch.tensor([0.1, 0.3, 1.2]), "mlp_norm_ratio": torch.tensor([0.2, 0.4, 2.0]),
         "attn_cka_matrix": torch.eye(3), "mlp_cka_matrix": torch.eye(3)}
    result = ResidualResult(name="residual_cka", tensors=t, meta={"blocks": [0, 1, 2], "model": "m"})
    curves, attn, mlp = result.figures()
    panels = curves.chart.to_json()["panels"]
    assert [p["kind"] for p in panels] == ["lines", "lines"] and panels[0]["x_ticks"] == ["0", "1", "2"]
    assert panels[0]["curves"][0]["values"] == pytest.approx([0.9, 0.5, 0.2])
    assert panels[1]["log_toggle"] is True and panels[1]["curves"][1]["values"] == pytest.approx([0.2, 0.4, 2.0])
    heat = attn.chart.to_json()["panels"][0]
    assert heat["kind"] == "heatmap" and heat["x_label"] == "branch output of block"


def test_curve_styles_baselines_bars_and_bands_are_checked() -> None:
    from vitscope.errors import VitscopeValueError
    from vitscope.viz.charts import Band, LinePanel

    assert curve("r", [1.0], style="dashed").baseline is True and curve("m", [1.0]).baseline is False
    assert curve("bottom", [1.0], style="dashed", baseline=False).baseline is False
    with pytest.raises(VitscopeValueError, match="curve style 'zigzag'"):
        Curve("m", [1.0], style="zigzag")
    with pytest.raises(VitscopeValueError, match="bars need a category x axis"):
        LinePanel("x", "y", [], [Curve("m", [1.0], style="bars", x=[0.5])], x_kind="value")
    with pytest.raises(VitscopeValueError, match=r"bands over ticks \['9'\]"):
        block_lines_chart([curve("m", [1.0, 2.0])], "y", 2, bands=[Band("capture", "1", "9")])
    chart = block_lines_chart([curve("m", [1.0, 2.0])], "y", 2, bands=[Band("capture", "0", "1")])
    assert chart.to_json()["panels"][0]["bands"] == [{"name": "capture", "first": "0", "last": "1"}]


def test_probe_curves_chart_every_metric_with_random_chance_over_the_blocks() -> None:
    from vitscope.analyses.probes.result import probe_result

    res = probe_result("knn_probe", "knn", [2, 4, 6], {"accuracy": [0.2, 0.5, float("nan")], "top5": [0.6, 0.8, 0.9]},
                       {"accuracy": 0.1}, model="tiny")
    acc, top5 = res.figures()
    panel = acc.chart.to_json()["panels"][0]
    assert panel["x_ticks"] == ["2", "4", "6"] and panel["y_label"] == "accuracy"
    assert [c["values"] for c in panel["curves"]] == [[0.2, 0.5, None], [0.1, 0.1, 0.1]]
    assert [c["colour"] for c in panel["curves"]] == ["tiny", ""] and panel["curves"][1]["baseline"] is True
    assert len(top5.chart.to_json()["panels"][0]["curves"]) == 1  # no random score for it: no dashed line


def test_masking_charts_keep_one_colour_per_model_and_the_orders_apart() -> None:
    from vitscope.viz.masking_charts import foreground_chart, frequency_chart, ratio_chart

    acc = {o: torch.tensor([0.9, 0.5]) for o in ("top", "bottom", "random")}
    panel = ratio_chart({"vit": acc, "cnn": acc}, [0.1, 0.5], {"vit": 0.95}, "t").to_json()["panels"][0]
    styles = [(c["name"], c["style"], c["colour"], c["baseline"]) for c in panel["curves"]]
    assert styles[:4] == [("vit: top first", "line", "vit", False), ("vit: bottom first", "dashed", "vit", False),
                          ("vit: random first", "dotted", "vit", False), ("vit: unmasked", "line", "vit", True)]
    assert len(styles) == 7 and panel["curves"][0]["x"] == [10.0, 50.0] and panel["x_kind"] == "value"
    freq = frequency_chart({"m": torch.tensor([[0.1, 0.2], [0.3, 0.4]])}, [0.25, 1.0], {"m": 0.5})
    low, high, full = freq.to_json()["panels"][0]["curves"]
    assert (low["values"], high["values"], full["values"], full["x"]) == (
        pytest.approx([0.1, 0.2]), pytest.approx([0.3, 0.4]), [0.5, 0.5], [0.25, 1.0])
    bars = foreground_chart({"m": torch.tensor([[1.0, 1.0], [0.8, 0.9], [0.3, 0.6]])}, [1, 5]).to_json()["panels"][0]
    assert bars["x_ticks"] == ["top-1", "top-5"] and bars["log_toggle"] is False
    assert [(c["name"], c["values"]) for c in bars["curves"]] == [
        ("foreground only", pytest.approx([0.8, 0.9])), ("background only", pytest.approx([0.3, 0.6])),
        ("full image", [1.0, 1.0])]


def test_stages_chart_shades_each_stage_over_its_blocks() -> None:
    from vitscope.analyses.attention.interrelation import InterrelationResult

    kk = torch.tensor([[0.8, 0.6], [0.4, 0.2], [0.1, 0.3]])
    t = {k: kk for k in ("KK", "KN", "NK", "NN", "focus")} | {"focus_normalised": kk / 2}
    result = InterrelationResult("interrelation", t, {"blocks": [3, 4, 5],
                                                      "stages": {"retrieval": [3], "capture": [4, 5], "coach": []}})
    stages = next(f for f in result.figures() if f.stem == "interrelation_stages").chart.to_json()["panels"][0]
    assert stages["bands"] == [{"name": "retrieval", "first": "3", "last": "3"},
                               {"name": "capture", "first": "4", "last": "5"}]
    assert stages["curves"][0]["values"] == pytest.approx([0.7, 0.3, 0.2])
    assert stages["curves"][-1]["values"] == pytest.approx([0.35, 0.15, 0.1]) and list(stages["y_range"]) == [0.0, 1.0]


def test_bands_take_the_log_toggle_away_and_refuse_bars() -> None:
    from vitscope.errors import VitscopeValueError
    from vitscope.viz.charts import Band, LinePanel

    chart = block_lines_chart([curve("m", [0.5, 0.7])], "y", 2, bands=[Band("capture", "0", "1")])
    assert chart.panels[0].log_toggle is False  # bands are bars from the axis foot, which a log axis lacks
    with pytest.raises(VitscopeValueError, match="cannot also have bars"):
        LinePanel("block", "y", ["0"], [Curve("m", [1.0], style="bars")], bands=[Band("b", "0", "0")])


def test_a_figure_file_records_its_smallest_drawn_text_tick_labels_included(tmp_path) -> None:
    from matplotlib.figure import Figure

    from vitscope.viz.raster import smallest_text_px
    from vitscope.viz.save import save_figure

    fig = Figure()
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1])
    ax.set_title("big", fontsize=20)
    ax.tick_params(labelsize=6)  # tick labels have their text only once drawn
    png = save_figure(fig, tmp_path / "f", dpi=72)[0]
    assert smallest_text_px(png) == pytest.approx(6.0)
