"""Figures drawn in forked workers give the same files, in the same order, as figures drawn one by one."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitscope.analyses.result import Figure
from vitscope.outputs.drawing import MIN_FIGURES_PER_WORKER, draw_figures, figure_workers


def _figures(n: int) -> list[Figure]:
    def figure(i: int) -> Figure:
        pixels = np.full((4, 6, 3), 20 * i, dtype=np.uint8)  # a closure over local data: nothing to pickle

        def draw(stem: Path) -> list[Path]:
            path = stem.with_name(stem.name + ".png")
            Image.fromarray(pixels).save(path)
            return [path]
        return Figure(f"f{i}", draw, f"figure {i}", "a caption")
    return [figure(i) for i in range(n)]


def test_workers_follow_the_setting_the_cpus_and_the_figure_count(monkeypatch) -> None:
    monkeypatch.delenv("VITSCOPE_FIGURE_WORKERS", raising=False)
    linux = sys.platform.startswith("linux")
    assert figure_workers(40, cpus=2) == (2 if linux else 1)
    assert figure_workers(40, cpus=64) == (8 if linux else 1)
    assert figure_workers(2 * MIN_FIGURES_PER_WORKER - 1, cpus=16) == 1
    monkeypatch.setenv("VITSCOPE_FIGURE_WORKERS", "1")
    assert figure_workers(40, cpus=16) == 1
    for bad in ("0", "two"):
        monkeypatch.setenv("VITSCOPE_FIGURE_WORKERS", bad)
        with pytest.raises(ValueError, match="VITSCOPE_FIGURE_WORKERS"):
            figure_workers(40, cpus=16)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="figures are drawn in forked workers on Linux only")
def test_forked_workers_draw_the_same_files_in_job_order(tmp_path) -> None:
    figures = _figures(9)
    results = {}
    for workers in (1, 3):
        folder = tmp_path / f"w{workers}"
        folder.mkdir()
        ticks: list[int] = []
        results[workers] = draw_figures([(f, folder / f.stem) for f in figures],
                                        lambda ticks=ticks: ticks.append(1), workers)
        assert len(ticks) == len(figures)  # the progress bar moves once per figure
    assert [[p.name for p in ps] for ps in results[1]] == [[p.name for p in ps] for ps in results[3]]
    assert [ps[0].name for ps in results[3]] == [f"f{i}.png" for i in range(9)]
    for one, many in zip(results[1], results[3]):
        assert one[0].read_bytes() == many[0].read_bytes()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="figures are drawn in forked workers on Linux only")
def test_a_failing_figure_fails_the_writing(tmp_path) -> None:
    def broken(stem: Path) -> list[Path]:
        raise RuntimeError("cannot draw this one")

    jobs = [(f, tmp_path / f.stem) for f in _figures(4)] + [(Figure("bad", broken, "bad", "c"), tmp_path / "bad")]
    with pytest.raises(RuntimeError, match="cannot draw this one"):
        draw_figures(jobs, workers=2)


def test_legends_sit_outside_the_plotting_area_and_stay_in_the_file(tmp_path) -> None:
    from matplotlib.figure import Figure
    from PIL import Image

    from vitscope.viz.save import outside_legend, save_figure

    fig = Figure(figsize=(3, 2))
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1], label="a model with a long name")
    legend = outside_legend(ax, fontsize=8, loc="best")
    fig.canvas.draw()
    box, axes = legend.get_window_extent(), ax.get_window_extent()
    assert box.x0 >= axes.x1  # beside the axes, not over the curves
    path = save_figure(fig, tmp_path / "curve", dpi=100, svg=False)[0]
    assert Image.open(path).size[0] > 300  # cropped around the legend, not cut at the figure's 3 inches


def test_a_legend_goes_under_the_axes_when_a_twin_axis_holds_the_right_side() -> None:
    from matplotlib.figure import Figure

    from vitscope.viz.save import outside_legend

    fig = Figure(figsize=(4, 3))
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1], label="KK")
    ax.twinx().plot([0, 1], [1, 0], "--")
    legend = outside_legend(ax, fontsize=8)
    fig.canvas.draw()
    assert legend.get_window_extent().y1 <= ax.get_window_extent().y0  # below the plotting area
