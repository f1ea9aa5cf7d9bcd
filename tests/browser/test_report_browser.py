"""report.html in a real browser: Playwright driving Debian's chromium-headless-shell.

`make test` installs chromium-headless-shell when it is missing (as root, with apt-get); the test skips,
saying why, only when no Chromium binary can be found. Set VITSCOPE_CHROMIUM to use another binary.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from vitscope.data.synthetic.write import synthesize
from vitscope.workflows.analyze import run_analyze
from vitscope.workflows.options import AnalyzeOptions, resolve

CANDIDATES = ("/usr/lib/chromium/chromium-headless-shell", "/usr/bin/chromium-headless-shell",
              "/usr/lib/chromium/chromium", "/usr/bin/chromium")


def chromium_binary() -> str | None:
    """The Chromium to drive: $VITSCOPE_CHROMIUM, chromium-headless-shell on PATH, or a Debian path."""
    found = [os.environ.get("VITSCOPE_CHROMIUM"), shutil.which("chromium-headless-shell"), *CANDIDATES,
             shutil.which("chromium")]
    return next((p for p in found if p and os.access(p, os.X_OK)), None)


def open_page(browser, report: Path, viewport: tuple[int, int] = (1280, 900)):
    """``(page, errors)``: ``report`` loaded in a new page of ``viewport``; ``errors`` collects console errors and
    uncaught exceptions from then on."""
    page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.goto(report.as_uri(), wait_until="load")
    return page, errors


def written_report(out: Path, results: dict, model: str) -> Path:
    """The report of an ``analyze`` run of ``results`` (drawn from results alone, no model run), written to ``out``."""
    from vitscope.outputs import RunResult, write_run

    write_run(out, RunResult("analyze", results=results, models=[{"id": model, "name": model}]), progress=False)
    return out / "report.html"


def chart_option(page, stem: str) -> tuple:
    """``(chart, option)``: the first chart of figure ``stem``, scrolled into view, and its ECharts option."""
    chart = page.locator(f'figure[data-stem="{stem}"] .vs-chart').first
    chart.scroll_into_view_if_needed()
    return chart, chart.evaluate("(d) => echarts.getInstanceByDom(d).getOption()")


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="playwright is not installed (pip install -e '.[dev]')")
    binary = chromium_binary()
    if binary is None:
        pytest.skip("chromium-headless-shell not found: install it with `apt-get install chromium-headless-shell` "
                    "(`make test` does so when run as root)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=binary, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("browser")
    coco = synthesize(base / "coco", "coco", n=6, size=64, seed=4)
    opts = resolve(AnalyzeOptions, {"model": "tiny-vit", "data": f"{coco}::coco", "out": str(base / "out"),
                                    "analyses": "cls_attention_maps,attention_distance", "device": "cpu",
                                    "batch_size": 3})
    run_analyze(opts, progress=False)
    return base / "out" / "report.html"


def test_report_loads_every_figure_and_the_explorer_responds(browser, report):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    requests: list[str] = []
    page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("request", lambda r: requests.append(r.url) if not r.url.startswith(("data:", "file:")) else None)
    page.goto(report.as_uri(), wait_until="load")

    images = page.evaluate("Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.alt])")
    assert len(images) > 20
    broken = [alt for complete, width, alt in images if not (complete and width > 0)]
    assert not broken, f"images that did not load: {broken[:5]}"

    zoom = page.locator(".vs-zoom-map").first
    caption = page.locator(".vs-zoom-caption").first
    cells = page.locator("table.vs-grid:not([hidden]) .vs-cell")
    assert cells.count() == 6 * 4  # tiny-vit: 6 blocks x 4 heads
    first_src = zoom.get_attribute("src")
    target = cells.nth(5)  # block 1, head 1
    target.hover()
    assert zoom.get_attribute("src") == target.locator("img").get_attribute("src") != first_src
    assert "block 1, head 1" in caption.inner_text()

    cells.nth(22).focus()  # keyboard users get the same view
    assert "block 5, head 2" in caption.inner_text()
    ends = [page.locator(f".vs-bar-{e}").first.inner_text() for e in ("lo", "hi")]  # the colour bar follows
    assert f"(map from {ends[0]} to {ends[1]})" in caption.inner_text()

    page.locator(".vs-source").nth(1).click()  # a single image (named by its file): map drawn over it
    cells = page.locator("table.vs-grid:not([hidden]) .vs-cell")
    cells.nth(3).hover()
    label, _, rest = caption.inner_text().partition(": ")
    assert label.endswith(".jpg") and rest.startswith("block 0, head 3")  # the image by its file name
    assert page.locator(".vs-zoom-base").first.is_visible()
    assert page.evaluate("document.querySelector('.vs-zoom-base').naturalWidth") > 0

    assert not errors, errors
    assert not requests, f"the report fetched {requests}"
    page.close()


def test_charts_draw_from_their_numbers_hover_hide_and_switch_scale(browser, report):
    page, errors = open_page(browser, report)

    figure = page.locator('figure[data-stem="attention_distance"]')
    assert figure.count() == 1
    chart = figure.locator(".vs-chart").first
    chart.scroll_into_view_if_needed()
    assert chart.locator("canvas").count() >= 1
    box = chart.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.4)
    tooltip = chart.locator("div", has_text="random attention (baseline)")
    tooltip.first.wait_for(state="visible", timeout=3000)
    text = tooltip.first.inner_text()
    assert text.startswith("block ") and any(ch.isdigit() for ch in text.split(":")[-1]), text

    state = ("(d) => { const o = echarts.getInstanceByDom(d).getOption(); "
             "return [o.legend[0].selected, o.yAxis[0].type]; }")
    selected, axis = chart.evaluate(state)
    assert axis == "value" and all(v is not False for v in selected.values())
    legend_y = box["y"] + box["height"] - 10  # the legend sits under the plot; its first entry is the model
    page.mouse.click(box["x"] + box["width"] * 0.5 - 60, legend_y)
    selected, _ = chart.evaluate(state)
    assert list(selected.values()).count(False) == 1, selected

    name = "(d) => echarts.getInstanceByDom(d).getOption().yAxis[0].name"
    before = chart.evaluate(name)
    figure.locator("button", has_text="log scale").first.click()
    assert chart.evaluate(state)[1] == "log" and chart.evaluate(name) == before != ""  # the axis keeps its name
    assert not errors, errors
    page.close()


PAYLOADS = ('<img src=x onerror="window.__xss=1">', '"><svg onload="window.__xss=2">')


@pytest.fixture(scope="module")
def hostile_report(tmp_path_factory) -> Path:
    """A report whose model directory, data folder and file names are HTML payloads."""
    import numpy as np
    import torch
    import transformers as tf
    from PIL import Image

    base = tmp_path_factory.mktemp("xss")
    model = base / PAYLOADS[0]
    torch.manual_seed(0)
    tf.ViTModel(tf.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                             image_size=32, patch_size=8), add_pooling_layer=False).save_pretrained(model)
    photos = base / PAYLOADS[1]
    photos.mkdir()
    rng = np.random.default_rng(0)
    for i, name in enumerate(PAYLOADS * 2):
        Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(photos / f"{name}{i}.png")
    (photos / f"{PAYLOADS[0]}broken.png").write_bytes(b"not a png")  # listed as skipped
    opts = resolve(AnalyzeOptions, {"model": f"hf:{model}", "data": str(photos), "out": str(base / "out"),
                                    "analyses": "attention_distance,cls_attention_maps", "device": "cpu",
                                    "batch_size": 2})
    run_analyze(opts, progress=False)
    return base / "out" / "report.html"


def test_user_strings_that_are_html_stay_text_in_the_browser(browser, hostile_report):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.goto(hostile_report.as_uri(), wait_until="load")
    chart = page.locator('figure[data-stem="attention_distance"] .vs-chart').first
    chart.scroll_into_view_if_needed()
    box = chart.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.4)  # the tooltip names the model
    page.wait_for_timeout(300)
    assert page.evaluate("window.__xss") is None  # no payload ran
    assert page.locator('img[src="x"]').count() == 0 and page.locator("svg[onload]").count() == 0
    text = page.locator("body").inner_text()
    assert PAYLOADS[0] in text  # shown as text (the model and its path)
    tooltip = chart.locator("div", has_text="onerror").first
    assert tooltip.count() == 1 and "window.__xss=1" in tooltip.inner_text()  # the tooltip shows the name as text
    assert not errors, errors
    page.close()


#: screenshots kept as test artefacts (look at them): build/screenshots, or $VITSCOPE_SCREENSHOTS
SCREENSHOTS = Path(os.environ.get("VITSCOPE_SCREENSHOTS",
                                  Path(__file__).resolve().parents[2] / "build" / "screenshots"))


@pytest.fixture(scope="module")
def pairs_report(tmp_path_factory) -> Path:
    """A page with the retrieval explorer of two embedding models (a ViT and a CNN) on a small world."""
    from vitscope.data.open import as_source
    from vitscope.report.model import Report, Section
    from vitscope.report.render import render_html
    from vitscope.workflows.demo_pairs import retrieval_explorer

    base = tmp_path_factory.mktemp("pairs")
    data = as_source(f"{synthesize(base / 'coco', 'coco', n=16, size=64, seed=7)}::coco")
    labels = [data.targets(i).get("label", -1) for i in range(len(data))]
    names = [Path(data.path(i)).name for i in range(len(data))]
    explorer = retrieval_explorer(data, names, labels, lambda i: f"class {labels[i]}",
                                  models=("tiny-vit-metric", "tiny-resnet-metric"), num_queries=4, k=3)
    page = base / "report.html"
    page.write_text(render_html(Report("Paired similarity", sections=[
        Section("pairs", "Paired similarity", "", pair_explorers=[explorer])])), encoding="utf-8")
    return page


@pytest.mark.parametrize("viewport", [(1280, 800), (800, 1000)], ids=["1280x800", "800x1000"])
def test_the_retrieval_explorer_changes_maps_with_the_query_and_the_model(browser, pairs_report, viewport):
    page, errors = open_page(browser, pairs_report, viewport)
    maps = page.locator(".vs-pairs-hits img.map")

    def shown():
        return [maps.nth(i).get_attribute("src") for i in range(maps.count())]

    assert maps.count() == 3 * 2  # three hits, a map over the query and one over the hit
    first = shown()
    page.locator(".vs-pairs-queries button").nth(1).click()
    assert shown() != first and page.locator(".vs-pairs-queries button").nth(1).get_attribute("aria-pressed") == "true"
    kinds = page.locator(".vs-pairs-kinds button")
    kinds.nth(1).click()  # R^T gamma: other maps for the same hits
    transposed = shown()
    assert transposed != first
    page.locator(".vs-pairs-models button", has_text="tiny-resnet-metric").click()
    assert kinds.nth(0).is_disabled() and kinds.nth(2).get_attribute("aria-pressed") == "true"  # a CNN: raw maps
    assert shown() != transposed
    assert "cosine" in page.locator(".vs-pair figcaption").first.inner_text()
    assert page.locator(".vs-pairs-scale .vs-bar").first.is_visible()  # the maps' colour bar
    query = page.locator(".vs-pairs-query").first.inner_text()  # the query named by file and class
    assert query.startswith("Query: ") and ".jpg (class " in query and "tiny-resnet-metric" in query, query
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the page scrolls sideways by {overflow} px"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"retrieval_explorer_{viewport[0]}x{viewport[1]}.png"), full_page=True)
    assert not errors, errors
    page.close()


@pytest.mark.parametrize("viewport", [(1280, 800), (800, 1000)], ids=["1280x800", "800x1000"])
def test_every_figure_has_a_caption_and_its_paper_and_nothing_overflows(browser, report, viewport):
    page, errors = open_page(browser, report, viewport)
    page.wait_for_timeout(300)  # charts draw after load
    figures = page.locator("main figure.fig")
    assert figures.count() >= 2
    for i in range(figures.count()):
        caption = figures.nth(i).locator("figcaption").first
        assert len(caption.inner_text().strip()) > 20, f"figure {i} has no caption"
        assert caption.locator(".paper").count() == 1, f"figure {i} names no paper figure"
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the page scrolls sideways by {overflow} px"
    nav = page.locator("nav").bounding_box()
    assert nav["width"] <= viewport[0]  # the navigation wraps instead of running off-screen
    page.locator("nav a").last.click()
    target = page.evaluate("document.getElementById(location.hash.slice(1)).getBoundingClientRect().top")
    assert target >= nav["height"] - 1, "the section opened under the sticky navigation"
    sizes = shown_text_sizes(page)
    assert sizes and all(px >= SMALLEST_TEXT[viewport] for _, px in sizes), sizes
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"analyze_report_{viewport[0]}x{viewport[1]}.png"), full_page=True)
    assert not errors, errors
    page.close()


@pytest.fixture(scope="module")
def masking_report(tmp_path_factory) -> Path:
    """Bars, a numeric x axis and shaded stages: the charts of the masking analyses and paper 003's stages,
    from their results (no model needed to draw them)."""
    import torch

    from vitscope.analyses.attention.interrelation import InterrelationResult
    from vitscope.analyses.masking.foreground import ForegroundMaskingResult
    from vitscope.analyses.masking.interrelation import InterrelationMaskingResult

    kk = torch.tensor([[0.8, 0.6], [0.5, 0.4], [0.2, 0.3], [0.1, 0.2]])
    inter = InterrelationResult("interrelation", {k: kk for k in ("KK", "KN", "NK", "NN", "focus")} |
                                {"focus_normalised": kk / 2},
                                {"stages": {"retrieval": [0, 1], "capture": [2], "coach": [3]}})
    fg = ForegroundMaskingResult("foreground_masking", {"normalised_accuracy": torch.tensor(
        [[1.0, 1.0], [0.82, 0.9], [0.31, 0.55]])}, {"topk": [1, 5], "model": "tiny-vit-sup"})
    ratios = [0.1, 0.3, 0.5]
    masking = InterrelationMaskingResult("interrelation_masking", {
        "accuracy": torch.tensor([[0.7, 0.5, 0.2], [0.9, 0.85, 0.8], [0.8, 0.7, 0.5]]),
        "full_accuracy": torch.tensor(0.95)}, {"model": "tiny-vit-sup", "block": -1, "mode": "drop", "fill": "",
                                               "num_images": 4, "orders": ["top", "bottom", "random"],
                                               "ratios": ratios})
    return written_report(tmp_path_factory.mktemp("masking") / "out", {
        "interrelation": inter, "foreground_masking": fg, "interrelation_masking": masking}, "tiny-vit-sup")


def test_bars_numeric_axes_and_stages_draw_with_values_on_hover(browser, masking_report):
    page, errors = open_page(browser, masking_report)
    option = "(d) => echarts.getInstanceByDom(d).getOption()"

    bars = page.locator('figure[data-stem="foreground_masking"] .vs-chart').first
    bars.scroll_into_view_if_needed()
    series = bars.evaluate(option)["series"]
    assert [s["type"] for s in series] == ["bar", "bar", "line"] and series[1]["itemStyle"]["decal"]
    box = bars.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.5)  # over the top-1 bars
    tip = bars.locator("div", has_text="background only")
    tip.first.wait_for(state="visible", timeout=3000)
    text = tip.first.inner_text()
    assert text.startswith("top-k accuracy top-1") and "0.82" in text and "0.31" in text and "(baseline)" in text, text

    ratio = page.locator('figure[data-stem="interrelation_masking"] .vs-chart').first
    ratio.scroll_into_view_if_needed()
    got = ratio.evaluate(option)
    assert got["xAxis"][0]["type"] == "value"
    drawn = [s for s in got["series"] if s["data"]]  # the data-range note is a legend entry without data
    assert [s["lineStyle"]["type"] for s in drawn] == ["solid", "dashed", "dotted", "solid"]
    assert [s["name"] for s in got["series"] if not s["data"]] == [got["series"][-1]["name"]]
    assert got["series"][-1]["name"].startswith("data ")
    box = ratio.bounding_box()
    page.mouse.move(box["x"] + 64 + (box["width"] - 84) * 0.6, box["y"] + box["height"] * 0.4)  # x = 30 %
    tip = ratio.locator("div", has_text="top first")
    tip.first.wait_for(state="visible", timeout=3000)
    assert "masked patches (%) 30" in tip.first.inner_text() and "0.5" in tip.first.inner_text()

    stages = page.locator('figure[data-stem="interrelation_stages"] .vs-chart').first
    stages.scroll_into_view_if_needed()
    bands = [s for s in stages.evaluate(option)["series"] if s["type"] == "bar"]  # whole block slots, behind
    assert [b["name"] for b in bands] == ["retrieval", "capture", "coach"]
    assert [[v != "-" for v in b["data"]] for b in bands] == [[True, True, False, False], [False, False, True, False],
                                                              [False, False, False, True]]
    box = stages.bounding_box()
    page.mouse.move(box["x"] + 64 + (box["width"] - 84) * 0.6, box["y"] + box["height"] * 0.4)  # block 2
    tip = stages.locator("div", has_text="focus / log K")
    tip.first.wait_for(state="visible", timeout=3000)
    assert "capture" not in tip.first.inner_text() and tip.first.inner_text().startswith("block 2")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "masking_charts_1280x900.png"), full_page=True)
    assert not errors, errors
    page.close()


#: the smallest text a picture may show, in CSS pixels, at each test size (charts are drawn by the browser)
SMALLEST_TEXT = {(1280, 800): 9.0, (800, 1000): 8.0}


def shown_text_sizes(page) -> list[tuple[str, float]]:
    """``(figure file, px)``: how large the smallest text of every picture appears on the page (the font size
    the file records, scaled as the page shows the picture)."""
    return page.evaluate("""() => Array.from(document.querySelectorAll('img[data-text-px]')).map(i =>
        [i.closest('a').getAttribute('href'), +i.dataset.textPx * i.clientWidth / +i.dataset.fileWidth])""")


@pytest.fixture(scope="module")
def pictures_report(tmp_path_factory) -> Path:
    """Every kind of picture the commands draw, at the size a DINOv2-S-like model (12 blocks, 6 heads, a 16 x 16
    grid) and default settings give it, with long file names."""
    import numpy as np
    import torch

    from vitscope.analyses.result import Figure, SummaryResult
    from vitscope.outputs import RunResult, write_run
    from vitscope.viz import attention_maps as am
    from vitscope.viz import explain_figures as ef
    from vitscope.viz import featviz_figures as ff
    from vitscope.viz.interrelation_figures import keypoint_grid_figure

    rng = np.random.default_rng(0)
    photos = rng.integers(0, 256, (5, 224, 224, 3), dtype=np.uint8)
    maps = rng.random((12, 6, 16, 16)).astype(np.float32)
    names = [f"n01440764_{i:05d}_a_long_file_name.JPEG" for i in range(5)]
    chw = torch.from_numpy(photos).permute(0, 3, 1, 2)
    draw = {
        "rollout": lambda p: am.rollout_figure(photos[:4], maps[0, :4], names[:4], maps[0, 0], maps[0, 1],
                                               "Attention rollout (13 images)", p),
        "block_head_maps": lambda p: am.block_head_maps(maps, f"CLS attention, {names[0]}", p, image=photos[0]),
        "aligned": lambda p: am.aligned_maps_figure(rng.random((12, 6, 31, 31)), [["glo"] * 6] * 12,
                                                    "Aligned aggregated attention maps", p),
        "keypoints": lambda p: keypoint_grid_figure(torch.from_numpy(photos[:4]),
                                                    torch.from_numpy(rng.integers(0, 3, (4, 16, 16))), p),
        "pair": lambda p: [ef.pair_figure(photos[0], photos[1], torch.from_numpy(maps[0, 0]),
                                          torch.from_numpy(maps[0, 1]), 0.42, p.with_suffix(".png"),
                                          torch.from_numpy(maps[1, 0]), torch.from_numpy(maps[1, 1]),
                                          names=(names[0], names[1]))],
        "given": lambda p: ef.signed_map_picture(photos[0], maps[0, 0], ef.even_share_scale(maps[0, 0]),
                                                 f"{names[0]} given {names[1]}", p),
        "panel": lambda p: [ff.panel_figure(chw[0].float() / 255, list(photos), torch.from_numpy(maps[0, :5]),
                                            "blocks.11.mlp.post:1234", p.with_suffix(".png"), [3.2] * 5, names)],
        "grid": lambda p: [ff.unit_grid_figure(chw.repeat(5, 1, 1, 1)[:24].float() / 255,
                                               [f"blocks.{b}.mlp.post:{c}" for b in range(12) for c in (17, 1234)],
                                               p.with_suffix(".png"), columns=2, title="Optimised images")],
        "top": lambda p: ff.top_activation_grid(torch.from_numpy(maps[:6, :5]), torch.ones(6, 5),
                                                [f"unit {u}" for u in range(6)],
                                                [[torch.from_numpy(photos[j]) for j in range(5)]] * 6,
                                                "blocks.11.mlp.post", p, names=[names] * 6),
    }
    figures = [Figure(stem, fn, stem, f"The {stem} picture at a real model's size.", "paper 002, fig. 2")
               for stem, fn in draw.items()]
    out = tmp_path_factory.mktemp("pictures") / "out"
    write_run(out, RunResult("analyze", results={"pictures": SummaryResult("pictures", {"n": 1}, figures=figures)}),
              progress=False)
    return out / "report.html"


@pytest.mark.parametrize("viewport", list(SMALLEST_TEXT), ids=["1280x800", "800x1000"])
def test_the_text_of_every_picture_stays_readable_as_the_page_shows_it(browser, pictures_report, viewport):
    page, errors = open_page(browser, pictures_report, viewport)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"pictures_{viewport[0]}x{viewport[1]}.png"), full_page=True)
    sizes = shown_text_sizes(page)
    assert len(sizes) == 9, sizes  # every picture records its smallest text
    small = [(name, round(px, 1)) for name, px in sizes if px < SMALLEST_TEXT[viewport]]
    assert not small, f"text under {SMALLEST_TEXT[viewport]} px at {viewport}: {small}"
    assert page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0
    assert not errors, errors
    page.close()


@pytest.fixture(scope="module")
def crowded_report(tmp_path_factory) -> Path:
    """Twelve models on one chart (more than the palette's ten colours) and a heat map of 32 heads."""
    import torch

    from vitscope.analyses.result import Result
    from vitscope.viz.charts import Chart, block_lines_chart, curve

    class Crowded(Result):
        def figures(self):
            lines = block_lines_chart([curve(f"model {k}", torch.rand(4) + k, f"model {k}") for k in range(12)],
                                      "value", 4)
            return [self.figure("_lines", lambda path: [], "Twelve models.", chart=Chart(lines.panels)),
                    self.heatmap_figure("_heads", torch.rand(3, 32), "32 heads", "value", "Thirty-two heads."),
                    self.heatmap_figure("_few", torch.rand(3, 6), "6 heads", "value", "Six heads.")]

    return written_report(tmp_path_factory.mktemp("crowded") / "out",
                          {"crowded": Crowded("crowded", {"x": torch.zeros(1)}, {})}, "tiny-vit")


def test_models_past_the_palette_differ_and_heat_map_labels_never_overlap(browser, crowded_report):
    page, errors = open_page(browser, crowded_report)
    series = chart_option(page, "crowded_lines")[1]["series"]
    looks = [(s["lineStyle"]["color"], str(s["lineStyle"]["type"]), s["symbol"]) for s in series if s["data"]]
    assert len(looks) == 12 and len(set(looks)) == 12, looks  # model 10 shares model 0's colour, not its look
    assert looks[10][0] == looks[0][0]
    axis = "(d) => echarts.getInstanceByDom(d).getOption().xAxis[0].axisLabel.interval"
    many = page.locator('figure[data-stem="crowded_heads"] .vs-chart').first
    many.scroll_into_view_if_needed()
    width = many.evaluate("(d) => d.clientWidth")
    # 32 two-digit labels need about 32 * 20 px: every one is printed only where the chart is that wide
    assert many.evaluate(axis) == (0 if (width - 180) / 32 >= 20 else "auto"), width
    few = page.locator('figure[data-stem="crowded_few"] .vs-chart').first
    assert few.evaluate(axis) == 0
    assert not errors, errors
    page.close()
