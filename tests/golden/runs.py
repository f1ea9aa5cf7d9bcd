"""The golden runs: commands on the synthetic world whose results.json must not change under a refactor.

Each run names the data it needs (written by ``vitscope synth``) and the command line that produces it; the
fixtures in ``fixtures/`` hold their normalised results.json as committed before the engine-v2 redesign.
``python -m golden.generate`` (from ``tests/``) rewrites them; do that only when a number moves on purpose,
and say why in the commit.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from golden.compare import CNN_TOLERANCE, TOLERANCE, normalise

FIXTURES = Path(__file__).parent / "fixtures"

#: name -> (format, n, extra synth options): every data set a golden run reads, written once per session.
DATA: dict[str, tuple[str, int, tuple[str, ...]]] = {
    "coco": ("coco", 12, ("--seed", "0")),
    "folder": ("imagefolder", 12, ("--seed", "1", "--classes", "3")),
    "labelled": ("imagefolder", 30, ("--seed", "3", "--classes", "3")),
    "revisitop": ("revisitop", 12, ("--seed", "3", "--classes", "3")),
    "davis": ("davis", 1, ("--seed", "3")),
    "spair": ("spair", 4, ("--seed", "3", "--classes", "3")),
}


@dataclass(frozen=True)
class GoldenRun:
    """One command of the golden set.

    Attributes:
        name: fixture name (``fixtures/<name>.json``).
        data: keys of :data:`DATA` the command reads.
        args: builds the command line from the data roots and the output folder.
        quick: part of ``make test`` (the others run with ``python -m golden.check``).
        tolerance: relative and absolute tolerance of every number (see :mod:`golden.compare`).
    """

    name: str
    data: tuple[str, ...]
    args: Callable[[dict[str, Path], Path], list[str]]
    quick: bool = True
    tolerance: float = TOLERANCE
    tags: dict[str, Any] = field(default_factory=dict)


def _analyze(model: str, data: str, fmt: str, analyses: str | None, batch: int = 4):
    def args(roots: dict[str, Path], out: Path) -> list[str]:
        chosen = ["--analyses", analyses] if analyses else []
        return ["analyze", "--model", model, "--data", f"{roots[data]}::{fmt}", "--out", str(out), *chosen,
                "--batch-size", str(batch), "--device", "cpu", "--no-resume"]
    return args


def _probe(model: str, data: str, fmt: str):
    def args(roots: dict[str, Path], out: Path) -> list[str]:
        return ["probe", "--model", model, "--data", f"{roots[data]}::{fmt}", "--out", str(out), "--device", "cpu",
                "--batch-size", "8", "--cache", str(out.parent / f"{out.name}-cache")]
    return args


def _compare(models: str, data: str, fmt: str):
    def args(roots: dict[str, Path], out: Path) -> list[str]:
        return ["compare", "--models", models, "--data", f"{roots[data]}::{fmt}", "--out", str(out),
                "--batch-size", "4", "--device", "cpu", "--no-resume"]
    return args


def _demo(quick: bool):
    def args(roots: dict[str, Path], out: Path) -> list[str]:
        return ["demo", "--out", str(out), *(["--quick"] if quick else [])]
    return args


RUNS: tuple[GoldenRun, ...] = (
    GoldenRun("analyze_groups", ("coco",),
              _analyze("tiny-vit-sup", "coco", "coco", "attention,representation,probes,interrelation,masking")),
    GoldenRun("analyze_default_registers", ("folder",), _analyze("tiny-vit-reg", "folder", "imagefolder", None)),
    GoldenRun("analyze_default_cnn", ("folder",), _analyze("tiny-resnet-sup", "folder", "imagefolder", None),
              tolerance=CNN_TOLERANCE),
    GoldenRun("compare", ("coco",), _compare("tiny-vit-sup,tiny-vit-metric-p16,tiny-resnet-sup", "coco", "coco")),
    GoldenRun("probe_labelled", ("labelled",), _probe("tiny-vit-metric", "labelled", "imagefolder")),
    GoldenRun("probe_retrieval", ("revisitop",), _probe("tiny-vit-metric", "revisitop", "revisitop")),
    GoldenRun("probe_davis", ("davis",), _probe("tiny-vit-metric", "davis", "davis")),
    GoldenRun("probe_spair", ("spair",), _probe("tiny-vit-metric", "spair", "spair")),
    # the demo writes its own data; tests/e2e/test_demo.py checks the quick one against its fixture
    GoldenRun("demo_quick", (), _demo(quick=True), quick=False),
    GoldenRun("demo", (), _demo(quick=False), quick=False),
)


def synth_args(key: str, root: Path) -> list[str]:
    """The ``vitscope synth`` command line of data set ``key`` under ``root``."""
    fmt, n, extra = DATA[key]
    return ["synth", "--out", str(root / key), "--format", fmt, "--n", str(n), "--size", "64", *extra]


def normalised(out: Path, roots: dict[str, Path]) -> dict[str, Any]:
    """The results.json in ``out`` with the run's own paths replaced by placeholders."""
    doc = json.loads((out / "results.json").read_text())
    places = [(out.parent / f"{out.name}-cache", "<CACHE>"), (out, "<OUT>"), *((p, f"<{k}>") for k, p in roots.items())]
    return normalise(doc, places)


def fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text())
