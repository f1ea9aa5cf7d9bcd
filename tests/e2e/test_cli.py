"""End-to-end: the vitscope command as a user runs it (a real process: exit codes, files written) and its
one-line errors (in this process)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from helpers.cli import cli, vitscope


def test_analyze_writes_results_tables_and_figures(tmp_path):
    data = tmp_path / "photos"
    data.mkdir()
    rng = np.random.default_rng(1)
    for i in range(3):
        Image.fromarray(rng.integers(0, 255, (80, 70, 3), dtype=np.uint8)).save(data / f"p{i}.jpg")
    (data / "bad.png").write_bytes(b"garbage")
    out = tmp_path / "out"
    proc = vitscope("analyze", "--model", "tiny-vit", "--data", str(data), "--out", str(out), "--batch-size", "2")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "results.json").read_text())
    assert doc["vitscope_version"] and doc["num_images"] == 3
    assert doc["models"][0]["name"] == "tiny-vit" and doc["data"]["fingerprint"]
    assert [Path(s["path"]).name for s in doc["skipped"]] == ["bad.png"]
    assert {"attention_stats", "mean_activation", "aligned_attention"} <= set(doc["analyses"])
    assert "saliency_iou" not in doc["analyses"]  # plain photos have no masks: not a default
    ent = np.array(doc["analyses"]["attention_stats"]["summary"]["entropy"])
    assert ent.shape == (6, 4) and (ent > 0).all() and (ent <= np.log(65) + 1e-6).all()
    for files in doc["analyses"].values():
        for rel in files["files"]["tables"] + files["files"]["figures"]:
            assert (out / rel).stat().st_size > 0
    assert (out / "charts" / "attention_stats_entropy.json").exists()  # drawn by the report's browser
    assert not (out / "figures" / "attention_stats_entropy.png").exists()  # files only with --figure-files
    assert (out / "figures" / "aligned_attention.png").exists()  # a picture of maps: always a file


def test_models_lists_registry_as_json():
    proc = cli("models", "--json")
    assert proc.returncode == 0
    names = {r["name"] for r in json.loads(proc.stdout)}
    assert {"tiny-vit", "tiny-resnet", "dino-vitb16", "mae-vitb16"} <= names


def test_models_prints_every_name_whole(monkeypatch):
    """The table never cuts or wraps a name (a registered one, or an entry point's long one), nor a source."""
    from vitscope.models import load

    long = {"name": "my-lab-vit-large-patch14-reg4-distilled-from-giant-at-518px@checkpoint-step-0123456",
            "family": "dinov2_with_registers", "blocks": 24, "heads": 16, "width": 1024, "patch": 14,
            "prefix": "cls+reg+reg+reg+reg", "offline": False, "source": "my-lab/vit-large-patch14-reg4-518-distilled"}
    rows = load.describe_models()
    monkeypatch.setattr(load, "describe_models", lambda: [*rows, long])
    proc = cli("models")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for row in [*rows, long]:
        line = next((line for line in lines if line.split()[:1] == [row["name"]]), None)
        assert line is not None, row["name"]  # the name, whole, at the start of its own line
        assert row["source"] in line.split(), row["source"]


def test_errors_are_one_line_with_status_1(tmp_path):
    cases = [
        ["analyze", "--model", "tiny-vitt", "--data", "skimage", "--out", str(tmp_path)],
        ["analyze", "--model", "tiny-resnet", "--data", "skimage", "--out", str(tmp_path), "-a", "attention_stats"],
        ["analyze", "--model", "hf:acme/not-cached", "--data", "skimage", "--out", str(tmp_path)],
        ["analyze", "--model", "tiny-vit", "--data", str(tmp_path / "nowhere"), "--out", str(tmp_path)],
    ]  # an unknown analysis is bad usage (status 2): test_bad_usage_is_status_2
    for args in cases:
        proc = cli(*args)
        assert proc.returncode == 1, (args, proc.stderr)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_bad_usage_is_status_2(tmp_path):
    assert vitscope("analyze", "--model", "tiny-vit").returncode == 2
    from helpers.cli import cli

    folder = tmp_path / "photos"
    folder.mkdir()
    from PIL import Image

    Image.new("RGB", (32, 32), (90, 20, 40)).save(folder / "a.png")
    for wrong in (["--device", "foo"], ["--dtype", "fp64"], ["-a", "nonexistent"], ["-p", "attention_stats.x=1"],
                  ["-a", "artifacts", "-p", "artifacts.massive_relative=abc"]):  # values the command cannot take
        run = cli("analyze", "-m", "tiny-vit", "-d", str(folder), "-o", str(tmp_path / "out"), *wrong)
        assert run.returncode == 2 and run.stderr.strip().splitlines()[-1].startswith("error: "), wrong


def test_help_and_version_do_not_import_torch() -> None:
    """``vitscope --help`` and ``--version`` answer at once: neither the package root nor the CLI imports torch
    (``import torch`` alone takes seconds)."""
    import subprocess
    import sys

    probe = "import sys, vitscope, vitscope.cli.main; print(sorted(m for m in ('torch', 'numpy', 'matplotlib') " \
            "if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr
    version = vitscope("--version")
    assert version.returncode == 0 and version.stdout.strip().startswith("vitscope ")


def test_a_pass_does_not_import_what_only_some_probes_use() -> None:
    """scikit-learn, SciPy and scikit-image cost over a second of start-up together; the engine and the default
    analyses must not import them until a probe that uses them runs."""
    import subprocess
    import sys

    probe = ("import sys, vitscope.workflows.analyze, vitscope.models.load, vitscope.analyses; "
             "print(sorted(m for m in ('sklearn', 'scipy', 'skimage') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_a_skipped_image_is_one_clean_warning_line(tmp_path):
    """vitscope's warnings print as ``warning: <message>``, without Python's file, line and source echo."""
    rng = np.random.default_rng(0)
    for i in range(2):
        Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(tmp_path / f"ok{i}.png")
    (tmp_path / "broken.png").write_bytes(b"not an image")
    proc = vitscope("analyze", "-m", "tiny-vit", "-d", str(tmp_path), "-a", "attention_stats", "-o",
                    str(tmp_path / "out"), "--no-resume")
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "broken.png" in line]
    assert len(lines) == 1 and lines[0].startswith("warning: skipping image: cannot read "), proc.stderr
    assert "Warning:" not in proc.stderr and "warnings.warn" not in proc.stderr, proc.stderr
