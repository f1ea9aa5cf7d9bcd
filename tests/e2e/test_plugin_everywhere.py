"""A plug-in analysis runs wherever a built-in one does: docs/extending.md's ``token_norm``, a file of the user's
named with ``--import``, through ``compare`` (each model, the report), and through ``analyze`` under ``torchrun``
with two processes, stopped after a batch and resumed, giving the numbers of one process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.cli import ENV, cli


def _torchrun(*args: str, cwd, env=None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", "-m", "vitscope",
               *args]
    return subprocess.run(command, capture_output=True, text=True, env=env or ENV, timeout=300, cwd=cwd)


def test_compare_runs_the_plugin_for_each_model_and_reports_it(lab) -> None:
    run = cli("compare", "--import", "my_lab/token_norm.py", "--models", "tiny-vit,tiny-vit-p16", "-d", "photos",
              "-o", "cmp", "-a", "token_norm", "-p", "token_norm.block=1", "--no-resume")
    assert run.returncode == 0, run.stdout + run.stderr
    analyses = json.loads((lab / "cmp" / "results.json").read_text())["analyses"]
    assert {"token_norm@tiny-vit", "token_norm@tiny-vit-p16"} <= set(analyses)
    ours = analyses["token_norm@tiny-vit"]["summary"]["mean_norm"]
    assert ours == pytest.approx(mean_norm_by_hand("tiny-vit", 1), rel=1e-6)  # the -p value reached the analysis
    assert ours != analyses["token_norm@tiny-vit-p16"]["summary"]["mean_norm"]
    report = (lab / "cmp" / "report.html").read_text()
    assert "Token norm (tiny-vit)" in report and "Token norm (tiny-vit-p16)" in report


def mean_norm_by_hand(model: str, block: int) -> float:
    """The doc's statistic over ``photos/`` straight from a recorded forward pass."""
    import torch
    from PIL import Image

    import vitscope

    backbone = vitscope.load_model(model)
    images = [Image.open(p).convert("RGB") for p in sorted(Path("photos").iterdir())]
    with torch.no_grad(), backbone.record(f"blocks.{block}.resid_post") as rec:
        backbone(backbone.preprocess(images))
    return float(rec[f"blocks.{block}.resid_post"].double().norm(dim=-1).mean())


def test_two_processes_stopped_and_resumed_give_the_one_process_numbers(lab) -> None:
    common = ["analyze", "--import", "my_lab/token_norm.py", "-m", "tiny-vit", "-d", "photos", "-a",
              "token_norm,attention_distance", "-p", "token_norm.block=2", "-b", "1", "--device", "cpu"]
    one = cli(*common, "-o", "one", "--no-resume")
    assert one.returncode == 0, one.stdout + one.stderr
    stopped = _torchrun(*common, "-o", "two", cwd=lab, env={**ENV, "VITSCOPE_STOP_AFTER_BATCHES": "1"})
    assert stopped.returncode != 0 and "state saved" in stopped.stderr, stopped.stderr[-2000:]
    resumed = _torchrun(*common, "-o", "two", cwd=lab)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming from saved state" in resumed.stderr
    a, b = (json.loads((lab / d / "results.json").read_text())["analyses"]["token_norm"] for d in ("one", "two"))
    assert a["summary"]["mean_norm"] == pytest.approx(b["summary"]["mean_norm"], rel=1e-6)
    assert a["summary"] == pytest.approx(b["summary"], rel=1e-6)
    assert 'id="s-token-norm"' in (lab / "two" / "report.html").read_text()
