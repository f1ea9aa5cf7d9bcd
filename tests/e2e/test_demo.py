"""End-to-end: `vitscope demo --quick` on a fresh output folder, as CI and a new user run it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from golden.compare import differences
from golden.runs import fixture, normalised

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def test_demo_quick_writes_the_comparison_and_a_self_contained_report(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "vitscope.cli", "demo", "--quick", "--out", str(out)],
                          capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "demo report:" in proc.stdout
    doc = json.loads((out / "results.json").read_text())
    moved = differences(fixture("demo_quick"), normalised(out, {}), allow_extra=True)
    assert not moved, "the demo's numbers moved:\n" + "\n".join(moved)  # the engine-v2 golden run
    from vitscope.zoo.catalog import ZOO

    zoo = [e.name for e in ZOO]
    assert [m["id"] for m in doc["models"]] == zoo and all(m["weights_sha256"] for m in doc["models"])
    assert doc["config"]["models"] == zoo and doc["config"]["demo"]["quick"] is True
    assert doc["data"]["fingerprint"]["method"].startswith("stat") and len(doc["data"]["fingerprint"]["digest"]) == 16
    assert doc["num_images"] == 64 and set(doc["images_per_model"].values()) == {64}
    summary = doc["analyses"]["compare"]["summary"]
    curves = summary["curves"]
    cnns = {e.name for e in ZOO if e.arch == "tiny-resnet"}
    for quantity in ("attention_distance", "saliency_iou"):  # transformers only: the CNN has no attention
        assert set(curves[quantity]) == set(zoo) - cnns, quantity
    for quantity in ("clustering_purity", "knn_accuracy", "cka_to_reference"):
        assert set(curves[quantity]) == set(zoo), quantity
    assert curves["cka_to_reference"][zoo[0]]["values"] == [1.0] * 6  # the reference against itself
    purity = curves["clustering_purity"]["tiny-vit-sup"]["values"]
    assert purity[-1] > summary["random"]["clustering_purity"]["tiny-vit-sup"] + 0.2  # the supervised model clusters
    matrix = summary["cka_matrix"]
    assert len(matrix) == len(zoo) and all(abs(matrix[i][i] - 1) < 1e-6 for i in range(len(zoo)))
    assert {r["quantity"] for r in summary["best_blocks"]} == {"saliency_iou", "clustering_purity", "knn_accuracy"}
    pairs = doc["paired_similarity"]["pairs"]
    assert len(pairs) == 4 and all(-1 <= p["score"] <= 1 for p in pairs)
    assert sum(p["label_a"] == p["label_b"] for p in pairs) == 3
    for rel in doc["analyses"]["compare"]["files"]["figures"] + doc["paired_similarity"]["files"]:
        assert (out / rel).stat().st_size > 0, rel
    html = (out / "report.html").read_text()
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", html)  # nothing fetched from anywhere
    for part in ("Best block per model", "Mean attention distance", "Clustering purity", "k-NN accuracy",
                 "Paired similarity", "Attention maps per model", "paper 000, fig. 4", "paper 002, fig. 6"):
        assert part in html, part
    assert html.count('class="explorer" data-explorer') == len(set(zoo) - cnns)  # one explorer per transformer
    _check_paper_sections(out, doc, html)
    assert not (out / ".vitscope-state").exists()
    _look_at_the_demo_report(out / "report.html")


def _check_paper_sections(out, doc, html) -> None:
    """Papers 001 and 003 each have their sections, as the default demo runs them (smaller with --quick)."""
    sections = ("featviz", "token_mixing", "interrelation", "interrelation_masking")
    analyses = doc["analyses"]
    assert set(sections) <= set(analyses), sorted(analyses)
    positions = [html.find(f'id="s-{name.replace("_", "-")}"') for name in sections]
    assert -1 not in positions and positions == sorted(positions), positions  # in order, after the comparison
    assert positions[0] > html.find('id="s-paired-similarity"')
    from vitscope.workflows.demo_papers import PAPER_MODEL, PAPER_SECTIONS, paper_settings

    assert sections == PAPER_SECTIONS
    settings = paper_settings(quick=True)
    assert doc["config"]["demo"]["papers"] == json.loads(json.dumps(settings.to_dict()))
    units = analyses["featviz"]["summary"]["units"]
    assert list(units) == list(settings.units)
    for unit in units.values():  # optimised image, then its top images among the section's images
        assert len(unit["top"]) == 5 and all(t["index"] < settings.images for t in unit["top"])
        for rel in (unit["image"], unit["panel"]):
            assert (out / rel).stat().st_size > 0, rel
    mixing = analyses["token_mixing"]["summary"]
    assert mixing["num_images"] == settings.images and mixing["model"] == PAPER_MODEL
    assert mixing["model_accuracy"] > 0.5 and len(mixing["isolate_cls"]) == 7  # blocks 0..6 of the 6-block model
    inter = analyses["interrelation"]["summary"]
    assert inter["num_images"] == settings.images and inter["images_with_keypoints"] > 0
    assert len(inter["KK_blocks"]) == 6 and all(0 <= kk <= 1 for kk in inter["KK_blocks"])
    masking = analyses["interrelation_masking"]["summary"]
    assert masking["ratios"] == list(settings.ratios) and masking["num_images"] == settings.images
    for name in sections:
        for rel in analyses[name]["files"]["figures"]:
            assert (out / rel).stat().st_size > 0, rel
    for part in ("Feature visualisation", "Last-layer token mixing", "paper 001, figs. 1 and 7",
                 "paper 001, figs. 2 and 5", "paper 001, fig. 6", "paper 003, fig. 5 and 6", "paper 003, fig. 8",
                 'id="paper-001"', 'id="paper-003"', f"{settings.steps} steps each"):
        assert part in html, part


def _look_at_the_demo_report(report) -> None:
    """In a real browser (when Chromium is there): the demo report loads without errors or sideways scroll at
    both test sizes, its retrieval explorer is there; full-page screenshots are kept as test artefacts."""
    import pytest

    sync_api = pytest.importorskip("playwright.sync_api")
    from browser.test_report_browser import SCREENSHOTS, SMALLEST_TEXT, chromium_binary, open_page, shown_text_sizes

    binary = chromium_binary()
    if binary is None:
        return  # the browser tests say why; the demo's files were checked above
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=binary, args=["--no-sandbox"])
        for width, height in ((1280, 800), (800, 1000)):
            page, errors = open_page(browser, report, (width, height))
            page.wait_for_timeout(300)
            assert not errors, errors
            assert page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0
            assert page.locator("[data-pairs] .vs-pair").count() >= 1
            sizes = shown_text_sizes(page)
            assert sizes and all(px >= SMALLEST_TEXT[(width, height)] for _, px in sizes), sizes
            page.screenshot(path=str(SCREENSHOTS / f"demo_report_{width}x{height}.png"), full_page=True)
            page.close()
        browser.close()
