"""End-to-end: `vitscope analyze --analyses attention` on synthetic COCO data, as a user runs it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers.cli import cli
from vitscope.data.synthetic.write import synthesize

SUITE = {"cls_attention_maps", "spatial_average_maps", "aligned_attention", "attention_distance", "saliency_iou",
         "attention_focus", "attention_rollout"}


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return synthesize(tmp_path_factory.mktemp("coco"), "coco", n=6, size=64, seed=2)


def test_analyze_attention_group_runs_the_whole_suite_in_one_pass(coco, tmp_path):
    out = tmp_path / "out"
    proc = cli("analyze", "--model", "tiny-vit", "--data", f"{coco}::coco", "--out", str(out),
                    "--analyses", "attention", "--batch-size", "4", "--figure-files")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "results.json").read_text())
    assert set(doc["analyses"]) == SUITE and doc["num_images"] == 6
    assert doc["hooks"] == [f"blocks.{i}.attn.pattern" for i in range(6)]  # one recording feeds every analysis
    sal = doc["analyses"]["saliency_iou"]["summary"]
    assert sal["num_images"] + sal["num_empty"] == 6 and sal["sources"] == ["cls", "spatial"]
    best, rand = np.array(sal["cls_best_iou"]), np.array(sal["random_cls_best_iou"])
    assert best.shape == (6,) and ((best > 0) & (best <= 1)).all() and ((rand > 0) & (rand < 1)).all()
    dist = np.array(doc["analyses"]["attention_distance"]["summary"]["distance"])
    assert dist.shape == (6, 4) and ((dist > 0) & (dist < np.sqrt(2))).all()
    types = doc["analyses"]["aligned_attention"]["summary"]["head_types"]
    assert len(types) == 6 and all(len(row) == 4 for row in types)
    for name, entry in doc["analyses"].items():
        assert entry["files"]["tables"] and entry["files"]["figures"], name
        for rel in entry["files"]["tables"] + entry["files"]["figures"]:
            assert (out / rel).stat().st_size > 0, rel
    for stem in ("attention_distance", "saliency_iou", "attention_focus_entropy"):  # charts, drawn as asked
        assert (out / "charts" / f"{stem}.json").exists()
        assert (out / "figures" / f"{stem}.png").exists() and (out / "figures" / f"{stem}.svg").exists()
    for stem in ("cls_attention_maps_mean", "aligned_attention", "attention_rollout"):  # pictures: PNG only
        assert (out / "figures" / f"{stem}.png").exists() and not (out / "figures" / f"{stem}.svg").exists()
    assert (out / "tables" / "aligned_attention_offset_heads.csv").exists()


def test_attention_errors_are_one_line(coco, tmp_path):
    photos = tmp_path / "photos"
    photos.mkdir()
    from PIL import Image

    Image.fromarray(np.zeros((40, 40, 3), dtype=np.uint8)).save(photos / "a.png")
    cases = [
        (["--model", "tiny-resnet", "--data", f"{coco}::coco", "-a", "attention"], "no attention"),
        (["--model", "tiny-vit", "--data", str(photos), "-a", "saliency_iou"], "masks"),
    ]
    for args, needle in cases:
        proc = cli("analyze", *args, "--out", str(tmp_path / "o"))
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), (args, proc.stderr)
        assert needle in lines[0], lines[0]
