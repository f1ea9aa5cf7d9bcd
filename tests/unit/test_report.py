"""report.html: self-contained, escaped, with figures, tables and the block x head explorer."""

from __future__ import annotations

import base64
import re
from io import BytesIO

import numpy as np
import pytest
import torch
from PIL import Image

from vitscope.report import FigureItem, Report, Section, explorer_from_maps, render_html
from vitscope.report.tables import summary_tables
from vitscope.workflows.analyze import run_analyze
from vitscope.workflows.options import AnalyzeOptions, resolve

EVIL = "<script>alert('x')</script>"


def _png(path, value=128):
    Image.fromarray(np.full((6, 9, 3), value, dtype=np.uint8)).save(path)
    return path


def test_every_user_string_is_escaped(tmp_path):
    fig = _png(tmp_path / "f.png")
    ex = explorer_from_maps(EVIL, torch.rand(2, 3, 4, 4), image_maps=torch.rand(1, 2, 3, 4, 4),
                            images=torch.zeros(1, 16, 16, 3, dtype=torch.uint8), image_labels=[EVIL])
    report = Report(title=EVIL, subtitle=EVIL, summary=[("Model", EVIL)], config={"model": EVIL, EVIL: [EVIL]},
                    sections=[Section("s", EVIL, EVIL, [FigureItem(fig, EVIL, EVIL, EVIL)], explorers=[ex])],
                    notes=[EVIL])
    html = render_html(report)
    assert "<script>alert" not in html
    assert html.count("&lt;script&gt;alert(") >= 10
    assert len(re.findall(r"<script>", html)) == 1  # only the report's own inline script


def test_tables_pair_explorers_and_chart_data_escape_user_strings():
    """Text in tables and pair explorers is escaped; JSON for the page's scripts cannot close its script element."""
    from vitscope.report.model import PairExplorer, Table

    def page(text: str) -> str:
        chart = {"series": [{"name": f"</script><script>alert(1)//{text}", "data": [1, 2]}]}
        section = Section("s", text, text, [FigureItem(None, text, text, text, chart=chart, stem="c")],
                          tables=[Table(text, [text, "n"], [[text, 1.5]], note=text)],
                          pair_explorers=[PairExplorer(text, {"names": [text], "bar": "#fff"}, text, text)])
        return render_html(Report(title="t", sections=[section]))

    html, plain = page(EVIL), page("plain")
    assert "<script>alert" not in html and "</script><script>" not in html
    assert html.count("<script") == plain.count("<script") and html.count("</script>") == plain.count("</script>")


def test_report_is_self_contained(tmp_path):
    fig = _png(tmp_path / "f.png", 7)
    html = render_html(Report("t", sections=[Section("s", "S", figures=[FigureItem(fig, "F")])]))
    assert not re.search(r"""(src|href)=["']?(https?:|//|file:)""", html)
    assert "Content-Security-Policy" in html
    uris = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert base64.b64decode(uris[0]) == fig.read_bytes()


def test_heavy_figures_are_embedded_as_jpeg_light_ones_as_they_are(tmp_path):
    import io

    from vitscope.report.render import EMBED_BYTES, data_uri

    noisy = tmp_path / "noisy.png"  # a photo-like figure: PNG compresses it badly
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (400, 400, 3), dtype=np.uint8)).save(noisy)
    assert noisy.stat().st_size > EMBED_BYTES
    uri = data_uri(noisy)
    assert uri.startswith("data:image/jpeg;base64,")
    embedded = base64.b64decode(uri.split(",", 1)[1])
    assert len(embedded) < noisy.stat().st_size and Image.open(io.BytesIO(embedded)).size == (400, 400)
    light = _png(tmp_path / "light.png")
    assert base64.b64decode(data_uri(light).split(",", 1)[1]) == light.read_bytes()
    jpeg = io.BytesIO()
    Image.open(noisy).save(jpeg, format="JPEG")
    assert data_uri(jpeg.getvalue()).startswith("data:image/jpeg;base64,")  # bytes are sniffed, not assumed
    # PNG bytes follow the same rule as files
    assert data_uri(noisy.read_bytes()).startswith("data:image/jpeg;base64,")
    assert base64.b64decode(data_uri(light.read_bytes()).split(",", 1)[1]) == light.read_bytes()


def test_explorer_cells_are_one_png_per_block_and_head():
    maps = torch.zeros(3, 2, 4, 5)
    maps[1, 1, 2, 3] = 1.0
    ex = explorer_from_maps("t", maps, blocks=[0, 2, 4])
    grid = ex.grids[0]
    assert ex.blocks == [0, 2, 4] and ex.num_heads == 2 and ex.grid_shape == (4, 5)
    assert len(grid.cells) == 3 and all(len(row) == 2 for row in grid.cells)
    from io import BytesIO

    png = Image.open(BytesIO(grid.cells[1][1]))
    assert png.mode == "P"  # 8 bits a pixel: the colour map is the palette
    cell = np.asarray(png.convert("RGB"))
    assert cell.shape == (4, 5, 3)
    bright = np.unravel_index(cell.sum(-1).argmax(), cell.shape[:2])
    assert tuple(int(v) for v in bright) == (2, 3) and grid.ranges[1][1] == (0.0, 1.0)


def test_palette_cells_are_the_colour_map_exactly():
    import matplotlib

    from vitscope.report.explorer import _coloured

    m = np.random.default_rng(0).random((9, 7))
    png, (lo, hi) = _coloured(m, "inferno")
    got = np.asarray(Image.open(BytesIO(png)).convert("RGB"))
    want = matplotlib.colormaps["inferno"]((m - lo) / (hi - lo), bytes=True)[..., :3]
    assert np.array_equal(got, want)


def test_summary_tables_split_scalars_blocks_and_heads():
    summary = {"blocks": [0, 1], "num_images": 5, "distance": [[0.1, 0.2], [0.3, 0.4]], "block_mean": [0.15, 0.35],
               "big": {"shape": [9, 9], "mean": 0.5}}
    titles = [t.title for t in summary_tables("attention_distance", summary)]
    assert titles == ["Attention distance: per block", "Attention distance: distance (block x head)",
                      "Attention distance: settings and scores"]
    per_block = summary_tables("d", summary)[0]
    assert per_block.rows == [[0, "0.15"], [1, "0.35"]]


def test_summary_tables_show_score_rows_named_rows_and_declared_columns():
    # an experiment's scores beside their controls (a list of dicts), lists by a "rows" list of names, and a
    # [L, 3] matrix whose columns the result declares as ranks, not heads
    summary = {"blocks": [0, 1], "rows": ["embedding", "block 0", "block 1"], "norm_mean": [1.0, 2.0, 3.5],
               "top3": [[9.0, 8.0, 7.0], [6.0, 5.0, 4.0]],
               "scores": [{"metric": "pointing_game", "value": 0.5, "control": 0.25},
                          {"metric": "relevance_mass", "value": 0.75, "note": "x"}]}
    tables = {t.title: t for t in summary_tables("artifacts", summary, {"top3": "rank"}.get)}
    assert list(tables) == ["Artifacts: scores", "Artifacts: per row", "Artifacts: top3 (block x rank)"]
    scores = tables["Artifacts: scores"]
    assert scores.columns == ["metric", "value", "control", "note"]
    assert scores.rows == [["pointing_game", "0.5", "0.25", "None"], ["relevance_mass", "0.75", "None", "x"]]
    assert tables["Artifacts: per row"].rows == [["embedding", "1"], ["block 0", "2"], ["block 1", "3.5"]]
    assert tables["Artifacts: top3 (block x rank)"].columns == ["block", "rank 0", "rank 1", "rank 2"]


def test_the_explanations_and_artifact_reports_show_their_score_tables(tmp_path):
    from vitscope.analyses.result import SummaryResult
    from vitscope.outputs import RunResult, write_run

    rows = [{"method": "rollout", "metric": "pointing_game", "value": 0.8125, "control_other_image": 0.4375}]
    write_run(tmp_path, RunResult("explanations", results={"explanations": SummaryResult(
        "explanations", {"images": 2, "rows": rows})}), progress=False)
    html = (tmp_path / "report.html").read_text()
    assert "0.8125" in html and "0.4375" in html and "control other image" in html


def test_figures_name_the_paper_figures_they_reproduce():
    """Captions and paper references travel with the figures (no table to keep in step with file names)."""
    import torch

    from contract.fake_records import fake_record, fake_spec
    from vitscope.analyses import ANALYSES
    from vitscope.comparison.result import CAPTIONS

    spec, papers = fake_spec(), {}
    for name in ("attention_distance", "cls_attention_maps", "aligned_attention", "saliency_iou"):
        analysis = ANALYSES[name]()
        analysis.update(*fake_record(spec, analysis.required_hooks(spec), 3, torch.Generator().manual_seed(0)))
        papers.update({f.stem: f.paper for f in analysis.compute().figures()})
    assert papers["attention_distance"] == "paper 002, fig. 4 and 15"
    assert "fig. 2" in papers["cls_attention_maps_mean"] and "fig. 3" in papers["aligned_attention"]
    assert "fig. 5" in papers["saliency_iou"] and "fig. 6" in CAPTIONS["cka_matrix"][1]


@pytest.fixture(scope="module")
def evil_run(tmp_path_factory):
    """``vitscope analyze`` on a folder whose name is a script tag."""
    base = tmp_path_factory.mktemp("evil")
    photos = base / EVIL.replace("/", "_")
    photos.mkdir()
    for i in range(4):
        pixels = np.random.default_rng(i).integers(0, 255, (40, 40, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(photos / f"{i}.png")
    out = base / "out"
    opts = resolve(AnalyzeOptions, {"model": "tiny-vit", "data": str(photos), "out": str(out),
                                    "analyses": "cls_attention_maps,attention_distance", "device": "cpu"})
    run_analyze(opts, progress=False)
    return out


def test_analyze_report_escapes_the_data_name_and_has_every_part(evil_run):
    html = (evil_run / "report.html").read_text()
    assert "<script>alert" not in html and "&lt;script&gt;alert(" in html
    for part in ("Summary", "Data fingerprint", "Resolved configuration", "vitscope version", "Block x head explorer",
                 "paper 002, fig. 4 and 15", "Attention distance: per block"):
        assert part in html, part
    # one explorer cell per block and head (tiny-vit: 6 x 4) for the mean and for each kept image (4 here)
    assert html.count('class="vs-cell"') == 6 * 4 * 5
    assert not (evil_run / ".vitscope-state").exists()  # state removed once the outputs are written


def test_results_show_as_cards_in_jupyter_with_user_text_escaped() -> None:
    import torch

    from vitscope.analyses.result import Figure, Result
    from vitscope.engine.results import Results

    def draw(path):
        from vitscope.viz.raster import Canvas

        canvas = Canvas(20, 20)
        canvas.text(2, 2, "x")
        return canvas.save(path)

    class Shown(Result):
        def figures(self):
            return [Figure("shown_fig", draw, "A <b>figure</b>", "caption <script>", "paper 002, fig. 4")]

    result = Shown(name="knn_probe", tensors={"accuracy": torch.tensor([0.5, 0.75])}, meta={},
                   intro="<img src=x onerror=alert(1)>")
    card = result._repr_html_()
    assert "<h3" in card and "k-NN probe" in card and "data:image/png;base64," in card
    assert "<img src=x" not in card and "&lt;img src=x onerror=alert(1)&gt;" in card and "<script>" not in card
    run = Results({"knn_probe": result}, num_images=3, data={"name": "<photos>"})._repr_html_()
    assert "3 images" in run and "&lt;photos&gt;" in run and run.count("vitscope-card") == 1


def test_block_by_block_matrices_are_labelled_as_blocks_even_with_as_many_heads_as_blocks() -> None:
    from vitscope.report.tables import summary_tables

    square = [[1.0, 0.5], [0.5, 1.0]]
    tables = {t.title: t for t in summary_tables("cka", {"blocks": [0, 1], "cka": square})}
    assert list(tables) == ["CKA: CKA (block x block)"] and tables["CKA: CKA (block x block)"].columns == [
        "block", "block 0", "block 1"]
    heads = {t.title: t for t in summary_tables("attention_stats", {"blocks": [0, 1], "entropy": square})}
    assert heads["Attention stats: entropy (block x head)"].columns == ["block", "head 0", "head 1"]


def test_a_table_another_section_shows_is_left_out_and_a_settings_only_section_is_folded() -> None:
    from vitscope.report.build import _drop_repeated_tables
    from vitscope.report.model import Section, Table

    entropy = [[0, "4.1"], [1, "4.0"]]
    first = Section("a", "Attention stats", tables=[Table("attention_stats: entropy", ["block", "head 0"], entropy)])
    second = Section("b", "Attention focus", tables=[Table("attention_focus: entropy", ["block", "head 0"], entropy),
                                                     Table("attention_focus: focus", ["block", "head 0"],
                                                           [[0, "0.3"], [1, "0.2"]])])
    third = Section("c", "Mean activation", tables=[Table("mean_activation: settings and scores", ["key", "value"],
                                                          [["ddof", "1"]])])
    ones = [[5, "1", "1"], [6, "1", "1"]]  # two probes scoring 1 everywhere: equal by chance, each its own
    cls, mean = (Section(k, k, tables=[Table(f"{k}: per block", ["block", "purity", "NMI"], ones)])
                 for k in ("clustering_cls", "clustering_spatial_mean"))
    _drop_repeated_tables([first, second, third, cls, mean])
    assert [t.title for t in second.tables] == ["attention_focus: focus", "The same numbers in another section"]
    assert second.tables[-1].rows == [["entropy", "Attention stats"]]
    assert not first.folded and not second.folded and third.folded
    assert [t.title for t in mean.tables] == ["clustering_spatial_mean: per block"]


def test_wide_figures_are_embedded_as_thumbnails_linked_to_the_full_file(tmp_path) -> None:
    import base64
    import io

    import numpy as np
    from PIL import Image

    from vitscope.report.render import THUMBNAIL_WIDTH, data_uri, thumbnail_uri

    wide = tmp_path / "wide.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (300, 2400, 3), dtype=np.uint8)).save(wide)
    uri = thumbnail_uri(wide)
    with Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))) as shown:
        assert shown.size == (THUMBNAIL_WIDTH, 138)
    small = tmp_path / "small.png"
    Image.new("RGB", (400, 200), "white").save(small)
    assert thumbnail_uri(small) == data_uri(small)


def test_top_activation_figures_draw_each_map_over_its_image(tmp_path) -> None:
    import numpy as np
    from PIL import Image

    import vitscope
    from vitscope.data.memory import InMemoryImages
    from vitscope.viz.featviz_figures import top_activation_grid

    rng = np.random.default_rng(0)
    pictures = [np.zeros((64, 64, 3), dtype=np.uint8) for _ in range(6)]
    for k, image in enumerate(pictures):
        image[..., 1] = 255  # pure green pictures, drawn in grey under the maps
        image[rng.integers(0, 64, 50), rng.integers(0, 64, 50)] = k * 40
    result = vitscope.run(vitscope.load_model("tiny-vit"), InMemoryImages(pictures), ["top_activations"],
                          batch_size=3)["top_activations"]
    assert result.tensors["pictures"].shape[1:] == (64, 64, 3)
    assert set(result.meta["picture_indices"]) <= set(range(6)) and result.meta["picture_indices"]
    figure = result.figures()[0]
    assert figure.title.startswith("Top activations: blocks.") and "over its patches" in figure.caption
    drawn = np.asarray(Image.open(figure.draw(tmp_path / "top")[0]).convert("RGB"), dtype=np.float32)
    hook = result.meta["hooks"][0]
    maps, scores = result.tensors[f"{hook}.maps"][:1], result.tensors[f"{hook}.scores"][:1]
    alone = top_activation_grid(maps, scores, ["unit 0"], [[None] * maps.shape[1]], hook, tmp_path / "alone")[0]
    alone = np.asarray(Image.open(alone).convert("RGB"), dtype=np.float32)
    picture_grey = lambda a: int((np.abs(a - 85).max(-1) < 4).sum())  # green (0, 255, 0) in grey: 85
    assert picture_grey(drawn) > 500 and picture_grey(alone) < 50  # the pictures show, in grey, under the maps


def test_a_section_of_any_name_has_an_id_of_its_own_that_its_navigation_link_reaches() -> None:
    """Sections named as the page's own elements (an analysis called ``summary``) take none of their ids."""
    names = ["summary", "references", "paper-002", "vs-colour-keys"]
    html = render_html(Report("t", sections=[
        Section(name, f"Section {name}", "", figures=[FigureItem(None, "F", "A caption.", "paper 002, fig. 4",
                                                                  {"panels": []}, f"f{i}")])
        for i, name in enumerate(names)]))
    ids = re.findall(r'\sid="([^"]+)"', html)
    assert len(ids) == len(set(ids)) and {"summary", "references", "paper-002", "vs-colour-keys"} <= set(ids), ids
    nav = re.search(r"<nav[^>]*>(.*?)</nav>", html, re.S).group(1)
    links = re.findall(r'<a href="#([^"]+)">([^<]+)</a>', nav)
    assert [title for _, title in links] == ["Summary", *(f"Section {name}" for name in names), "References"]
    for target, title in links:  # each link lands on the section of its own title
        heading = re.search(r"<h2>([^<]*)", html[html.index(f'<section id="{target}">'):]).group(1)
        assert heading.strip() == title, (target, heading)


def test_paper_badges_link_to_the_references_the_page_cites_and_the_readme_lists_them_all() -> None:
    from pathlib import Path

    from vitscope.report.model import FigureItem, Report, Section
    from vitscope.report.references import PAPERS
    from vitscope.report.render import render_html

    chart = {"panels": []}
    html = render_html(Report("t", sections=[Section("s", "S", "As paper 003 section 5.", figures=[
        FigureItem(None, "F", "A caption.", "paper 002, fig. 4", chart, "f")])]))
    assert '<a class="paper" href="#paper-002">paper 002, fig. 4</a>' in html
    refs = re.search(r'<section id="references">(.*?)</section>', html, re.S).group(1)
    assert re.findall(r'id="paper-(\d{3})"', refs) == ["002", "003"]  # cited ones only, in order
    assert "Teaching Matters" in refs and "Visualizing Paired" not in refs and 'href="#references"' in html
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    for number, citation in PAPERS.items():  # the same citation, word for word
        assert f"paper {number}: {citation}" in readme, number


def test_a_heat_map_another_section_shows_is_left_out_but_equal_curves_stay() -> None:
    from vitscope.report.build import _drop_repeated_tables
    from vitscope.report.model import FigureItem, Section
    from vitscope.viz.charts import block_head_chart, block_lines_chart, curve

    entropy = [[4.1, 4.0], [3.9, 3.5]]
    heat = lambda title, e=0.0: block_head_chart([[v + e for v in r] for r in entropy], "entropy (nats)",
                                                 title=title).to_json()
    ones = block_lines_chart([curve("m", [1.0, 1.0], "m")], "purity", 2).to_json()
    stats = Section("stats", "Attention stats", figures=[FigureItem(None, "Entropy", "c", "", heat("a"), "s")])
    focus = Section("focus", "Attention focus", figures=[FigureItem(None, "Entropy", "c", "", heat("b", 3e-7), "f"),
                                                         FigureItem(None, "Purity", "c", "", ones, "p1")])
    other = Section("cls", "Clustering", figures=[FigureItem(None, "Purity", "c", "", ones, "p2")])
    _drop_repeated_tables([stats, focus, other])
    assert [f.stem for f in focus.figures] == ["p1"] and [f.stem for f in other.figures] == ["p2"]
    assert focus.tables[-1].rows == [["Entropy (chart)", "Attention stats"]]


def test_matrices_fold_under_their_title_and_per_block_tables_stay_open() -> None:
    from vitscope.report.model import Report, Section
    from vitscope.report.render import render_html
    from vitscope.report.tables import summary_tables

    tables = summary_tables("attention_stats", {"blocks": [0, 1], "entropy": [[1.0, 2.0], [3.0, 4.0]],
                                                "block_mean": [1.5, 3.5]})
    assert [t.folded for t in tables] == [False, True]
    html = render_html(Report("t", sections=[Section("s", "S", tables=tables)]))
    assert '<details class="vs-table"><summary>Attention stats: entropy (block x head) (the numbers)</summary>' in html
    assert "<h3>Attention stats: per block</h3>" in html


def test_a_badge_of_a_paper_the_list_does_not_know_links_nowhere() -> None:
    from vitscope.report.references import paper_number

    assert paper_number("paper 002, fig. 4") == "002" and paper_number("papers 003 and 001") == "003"
    assert paper_number("paper 004, fig. 1") == "" and paper_number("") == ""


def test_retrieval_explorer_maps_are_clear_at_the_even_share_and_coloured_at_the_ends() -> None:
    import base64
    import io

    import numpy as np
    from PIL import Image

    from vitscope.report.pair_explorer import _signed_png

    m = np.array([[1.0, 2.0, 3.0]])  # even share 2: the middle patch adds exactly its share
    url = _signed_png(m)
    rgba = np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGBA"), dtype=int)
    assert rgba[0, 1, 3] <= 2 and rgba[0, 0, 3] >= 200 and rgba[0, 2, 3] >= 200  # alpha: clear, then 80 %
    assert rgba[0, 0, 2] > rgba[0, 0, 0] and rgba[0, 2, 0] > rgba[0, 2, 2]  # blue below, red above


def test_the_summary_leaves_out_rows_a_command_does_not_have():
    from vitscope.report.sections import summary_rows

    rows = dict(summary_rows({"models": [], "data": {"name": "w", "source": "w::imagefolder"}}))
    assert rows["Data"] == "w: w::imagefolder"
    assert "Data fingerprint" not in rows and "Images analysed" not in rows  # never "None"
    assert "Data" not in dict(summary_rows({"models": []}))
