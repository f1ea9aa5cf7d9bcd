"""The 2025-2026 families from random-weight checkpoints the test writes (``save_pretrained`` directories, as a
user's download): DINOv3, I-JEPA, AIMv2, MetaCLIP 2 and SigLIP 2 NaFlex run the default ``vitscope analyze``,
``probe`` and ``compare`` on the synthetic world. I-JEPA, AIMv2 and SigLIP 2 have no CLS token: a default run
leaves out what needs one, with the reason, instead of failing. Images of several aspect ratios give SigLIP 2
NaFlex, and DINOv2 with ``--keep-aspect``, token grids of their own, which results.json lists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import vitscope
from helpers.cli import cli
from helpers.hf_factories import make
from vitscope.data.synthetic.write import synthesize

KINDS = {"dinov3": "dinov3", "ijepa": "ijepa", "aimv2": "aimv2", "metaclip2": "metaclip2", "siglip2": "siglip2"}
WITHOUT_CLS = {"ijepa", "aimv2", "siglip2"}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"{synthesize(tmp_path_factory.mktemp('world') / 'coco', 'coco', n=12, size=64, seed=4)}::coco"


@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = synthesize(tmp_path_factory.mktemp("labelled") / "folder", "imagefolder", n=24, size=64, seed=4)
    return f"{root}::imagefolder"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    out = {}
    for name, kind in KINDS.items():
        make(kind).save_pretrained(root / name)
        out[name] = root / name
    return out


@pytest.mark.parametrize("name", sorted(KINDS))
def test_the_default_analyze_and_probe_run(name: str, world: str, labelled: str, checkpoints, tmp_path: Path,
                                           one_thread) -> None:
    run = cli("analyze", "-m", str(checkpoints[name]), "-d", world, "-o", str(tmp_path / "a"), "--device", "cpu",
              "-b", "4", "--no-resume")
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads((tmp_path / "a" / "results.json").read_text())
    ran = set(doc["analyses"])
    assert {"attention_distance", "knn_probe", "saliency_iou"} <= ran
    not_run = {entry["analysis"]: entry["reason"] for entry in doc["skipped_analyses"]}
    if name == "siglip2":  # every image at its own grid: CKA of every token flattened is left out, with the way
        assert "set cka.tokens=spatial_mean" in not_run["cka"]
    else:
        assert "cka" in ran
    if name in WITHOUT_CLS:  # the probes pool the spatial mean; the CLS maps are left out with the reason
        assert "cls_attention_maps" not in ran and "CLS" in not_run["cls_attention_maps"]
    else:
        assert "cls_attention_maps" in ran
    pooled = vitscope.analyze(str(checkpoints[name]), world, "knn_probe", device="cpu", batch_size=4)
    assert pooled["knn_probe"].meta["tokens"] == ("spatial_mean" if name in WITHOUT_CLS else "cls")
    probe = cli("probe", "-m", str(checkpoints[name]), "-d", labelled, "-o", str(tmp_path / "p"), "--device", "cpu",
                "-b", "4", "--no-resume")
    assert probe.returncode == 0, probe.stdout + probe.stderr
    results = json.loads((tmp_path / "p" / "results.json").read_text())["analyses"]
    assert any(key.startswith("knn") for key in results) and any(key.startswith("linear") for key in results)


def test_compare_runs_the_new_families_side_by_side(world: str, checkpoints, tmp_path: Path, one_thread) -> None:
    models = ",".join(f"{name}={path}" for name, path in sorted(checkpoints.items()))
    run = cli("compare", "--models", models, "-d", world, "-o", str(tmp_path), "--device", "cpu", "-b", "4",
              "--no-resume")
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads((tmp_path / "results.json").read_text())
    assert [m["display_name"] for m in doc["models"]] == sorted(KINDS)
    assert set(doc["images_per_model"].values()) == {12}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> str:
    from helpers.mixed_world import stretched_coco

    return stretched_coco(tmp_path_factory.mktemp("mixed") / "world")


@pytest.mark.parametrize("name,flags", [("siglip2", []), ("dinov2", ["--keep-aspect"])])
def test_the_default_analyze_on_images_of_several_grids(name: str, flags: list[str], mixed: str, checkpoints,
                                                        tmp_path: Path, one_thread) -> None:
    """NaFlex keeps every image's aspect ratio by itself, DINOv2 when asked: the default run groups the images by
    grid, writes the grids seen, keeps a map per grid and leaves out what cannot pool ragged tokens (CKA of every
    token) with the way to run it."""
    path = checkpoints[name] if name in checkpoints else tmp_path / "dinov2"
    if name not in checkpoints:
        make(name).save_pretrained(path)
    run = cli("analyze", "-m", str(path), "-d", mixed, "-o", str(tmp_path / "a"), "--device", "cpu", "-b", "5",
              "--no-resume", *flags)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "aspect ratio kept, at most 16 patches" in run.stderr
    doc = json.loads((tmp_path / "a" / "results.json").read_text())
    grids = doc["models"][0]["grids"]
    assert grids == {"3x5": 4, "4x4": 4, "2x5": 2, "5x3": 2}, grids
    assert sum(grids.values()) == doc["num_images"] == 12 and doc["models"][0]["max_tokens"] == 16
    analyses = doc["analyses"]
    assert analyses["attention_distance"]["summary"]["grids"] == grids
    maps = "cls_attention_maps" if name == "dinov2" else "spatial_average_maps"
    assert "mean_map@2x5" in analyses[maps]["summary"], sorted(analyses[maps]["summary"])
    not_run = {entry["analysis"]: entry["reason"] for entry in doc["skipped_analyses"]}
    assert "set cka.tokens=spatial_mean" in not_run["cka"]
    again = cli("analyze", "-m", str(path), "-d", mixed, "-o", str(tmp_path / "b"), "--device", "cpu", "-b", "5",
                "--no-resume", "-a", "cka", "-p", "cka.tokens=spatial_mean", *flags)
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_probe_keeping_aspect_ratios_says_its_grids(mixed: str, tmp_path: Path, one_thread) -> None:
    """probe --keep-aspect: the features of every image at its own grid; each probe result lists the grids."""
    make("dinov2").save_pretrained(tmp_path / "dinov2")
    run = cli("probe", "-m", str(tmp_path / "dinov2"), "-d", mixed, "-o", str(tmp_path / "p"), "--device", "cpu",
              "-b", "5", "--no-resume", "--keep-aspect", "--cache", str(tmp_path / "cache"))
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads((tmp_path / "p" / "results.json").read_text())
    assert doc["analyses"]["clustering_regions"]["summary"]["grids"] == {"3x5": 4, "4x4": 4, "2x5": 2, "5x3": 2}
    assert doc["config"]["keep_aspect"] is True
