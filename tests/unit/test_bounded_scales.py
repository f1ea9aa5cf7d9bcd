"""Fixed scales for bounded quantities (issue 34, item 6): CKA, IoU, accuracies and shares are drawn on their
documented range in every chart and figure file, and the legend notes the range the data span."""

from __future__ import annotations

import json
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest
import torch

from golden.strict import EMBEDDED
from vitscope.analyses.attention.saliency import SaliencyIoUResult
from vitscope.analyses.attention.stats import AttentionStatsResult
from vitscope.analyses.probes.result import probe_result
from vitscope.analyses.representation.cka import CKAResult
from vitscope.comparison.curves import Comparison, Curve
from vitscope.comparison.result import ComparisonResult
from vitscope.outputs import RunResult, write_run
from vitscope.viz.charts import block_lines_chart, curve
from vitscope.viz.ranges import quantity_range, range_note

#: a CKA matrix whose smallest value is 0.886: drawn from its minimum, 0.886 would be the darkest colour
CKA = torch.tensor([[1.0, 0.95, 0.886], [0.95, 1.0, 0.93], [0.886, 0.93, 1.0]], dtype=torch.float64)


def _cka_result() -> CKAResult:
    return CKAResult("cka", {"cka": CKA}, {"blocks": [0, 1, 2], "model": "m", "num_images": 8})


def test_the_documented_ranges() -> None:
    for key in ("cka", "attn_cka_matrix", "cls_iou", "random_spatial_best_iou", "knn_accuracy", "accuracy",
                "mAP_medium", "R@1", "PCK@0.1", "J&F", "purity", "nmi", "KK", "background_share", "max_attention",
                "focus_normalised", "clustering_purity", "cka_to_reference", "saliency_iou"):
        assert quantity_range(key) == (0.0, 1.0), key
    assert quantity_range("ari") == (-0.5, 1.0)
    for key in ("entropy", "attention_distance", "distance", "focus", "normalised_accuracy", "accuracy_change",
                "token_norm", "norm ratio"):
        assert quantity_range(key) is None, key
    assert range_note((0.886, 1.0)) == "data 0.886–1.000" and range_note(None) == ""


def test_a_cka_chart_has_a_0_1_colour_scale_and_its_legend_notes_the_data_range(tmp_path: Path) -> None:
    result = _cka_result()
    out = write_run(tmp_path / "out", RunResult("analyze", results={"cka": result}), progress=False).parent
    panel = json.loads((out / "charts" / "cka.json").read_text())["panels"][0]
    assert panel["value_range"] == [0.0, 1.0]
    assert panel["data_range"] == pytest.approx([0.886, 1.0]) and panel["range_note"] == "data 0.886–1.000"
    embedded = [json.loads(block) for block in EMBEDDED.findall((out / "report.html").read_text(encoding="utf-8"))]
    assert panel in [p for chart in embedded if isinstance(chart, dict) for p in chart.get("panels", [])]


def _drawn(monkeypatch, module: str, draw, path: Path):
    """The matplotlib figure ``draw(path)`` hands to ``module.save_figure`` (not written)."""
    import importlib

    captured = []
    monkeypatch.setattr(importlib.import_module(module), "save_figure", lambda fig, *a, **k: captured.append(fig))
    draw(path)
    return captured[0]


def test_the_cka_figure_file_has_a_0_1_norm_and_a_colour_bar_noting_the_data_range(monkeypatch, tmp_path) -> None:
    fig = _drawn(monkeypatch, "vitscope.viz.representation_figures", _cka_result().figures()[0].draw, tmp_path / "c")
    image = fig.axes[0].images[0]
    assert (image.norm.vmin, image.norm.vmax) == (0.0, 1.0)
    assert fig.axes[1].get_ylabel() == "CKA (data 0.886–1.000)"  # the colour bar


def test_saliency_iou_heads_are_coloured_on_0_1_in_the_chart_and_the_file(monkeypatch, tmp_path) -> None:
    iou = torch.tensor([[0.31, 0.45], [0.52, 0.6]], dtype=torch.float64)
    result = SaliencyIoUResult("saliency_iou", {"cls_iou": iou, "cls_best_iou": iou.amax(-1),
                                                "random_cls_best_iou": torch.tensor([0.1, 0.1])},
                               {"sources": ["cls"], "blocks": [0, 1], "model": "m"})
    heads = next(f for f in result.figures() if f.stem == "saliency_iou_cls_heads")
    panel = heads.chart.to_json()["panels"][0]
    assert list(panel["value_range"]) == [0.0, 1.0] and panel["range_note"] == "data 0.310–0.600"
    fig = _drawn(monkeypatch, "vitscope.viz.heatmaps", heads.draw, tmp_path / "h")
    assert (fig.axes[0].images[0].norm.vmin, fig.axes[0].images[0].norm.vmax) == (0.0, 1.0)
    assert fig.axes[1].get_ylabel() == "mean IoU (data 0.310–0.600)"


def test_max_attention_is_a_share_and_entropy_keeps_the_data_s_scale() -> None:
    t = {"entropy": torch.tensor([[1.2, 2.0]]), "max_attention": torch.tensor([[0.2, 0.7]]),
         "entropy_normalised": torch.tensor([[0.3, 0.5]])}
    entropy, max_attention = AttentionStatsResult("attention_stats", t, {"blocks": [0], "num_images": 2}).figures()
    assert entropy.chart.panels[0].value_range is None and entropy.chart.panels[0].range_note == ""
    assert max_attention.chart.panels[0].value_range == (0.0, 1.0)


def test_curves_of_bounded_quantities_are_on_their_range_with_the_data_range_in_the_legend(monkeypatch,
                                                                                          tmp_path) -> None:
    comp = Comparison(curves={q: {"a": Curve([0, 1], [0.0, 1.0], [0.62, 0.71])}
                              for q in ("knn_accuracy", "attention_distance")})
    charts = {f.stem: f.chart.panels[0] for f in ComparisonResult(comp).figures()}
    assert charts["compare_knn_accuracy"].y_range == (0.0, 1.0)
    assert charts["compare_knn_accuracy"].range_note == "data 0.620–0.710"
    assert charts["compare_attention_distance"].y_range == (None, None)
    assert charts["compare_attention_distance"].range_note == ""  # a distance has no documented range
    ari = probe_result("clustering", "clustering", [0, 1], {"ari": [0.2, 0.4]}, {"ari": 0.0}).figures()[0]
    assert ari.chart.panels[0].y_range == (-0.5, 1.0)
    assert ari.chart.panels[0].range_note == "data 0.000–0.400"  # random chance drawn too
    fig = _drawn(monkeypatch, "vitscope.viz.representation_figures", ari.draw, tmp_path / "p")
    assert fig.axes[0].get_ylim() == (-0.5, 1.0)
    assert "data 0.000–0.400" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


#: a stand-in for ECharts and the page: every chart's options are kept in ``options``
PAGE = """
var options = [];
global.echarts = {format: {encodeHTML: function (s) { return s; }},
                  init: function () { return {setOption: function (o) { options.push(o); },
                                              getOption: function () { return {}; }}; }};
function el() { return {style: {}, appendChild: function () {}, setAttribute: function () {},
                        addEventListener: function () {}, clientWidth: 600}; }
global.window = {addEventListener: function () {}};
global.document = {
  getElementById: function () { return null; }, createElement: el,
  querySelectorAll: function () {
    return specs.map(function (s) {
      return {getAttribute: function () { return "x"; }, querySelector: function (q) {
        return q === ".vs-chart-panels" ? el() : {textContent: JSON.stringify(s)}; }};
    });
  }};
"""
REPORT = """console.log(JSON.stringify(options.map(function (o) {
  return {legend: o.legend, graphic: o.graphic, visualMap: o.visualMap, yAxis: o.yAxis}; })));"""


def test_the_report_script_draws_the_notes_in_the_legend_and_under_the_colour_bar() -> None:
    """charts.js run by node with a stand-in for ECharts and the page: the options it builds carry the notes."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (the browser tests draw the page in Chromium)")
    lines = block_lines_chart([curve("m", [0.62, 0.71], "m")], "accuracy", 2, y_range=(0.0, 1.0)).to_json()
    heat = _cka_result().figures()[0].chart.to_json()
    script = resources.files("vitscope.report").joinpath("templates/charts.js").read_text()
    harness = f"var specs = {json.dumps([lines, heat])};\n{PAGE}\n{script}\n{REPORT}"
    done = subprocess.run([node, "-e", harness], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    line_option, heat_option = json.loads(done.stdout)
    assert {"name": "data 0.620–0.710", "icon": "none", "textStyle": {"color": "#555"}} in line_option["legend"]["data"]
    assert (line_option["yAxis"]["min"], line_option["yAxis"]["max"]) == (0, 1)
    assert (heat_option["visualMap"]["min"], heat_option["visualMap"]["max"]) == (0, 1)
    assert heat_option["graphic"][0]["style"]["text"] == "data 0.886–1.000"
