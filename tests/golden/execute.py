"""Run golden commands in-process (as ``vitscope`` would in a fresh process, one intra-op thread)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from golden.runs import DATA, GoldenRun, normalised, synth_args


def _invoke(args: list[str]) -> None:
    from typer.testing import CliRunner

    from vitscope.cli.main import app

    result = CliRunner().invoke(app, args)
    if result.exit_code != 0:
        raise RuntimeError(f"vitscope {' '.join(args)} failed ({result.exit_code}): {result.output[-2000:]}"
                           ) from result.exception


def write_data(root: Path, keys: set[str] | None = None) -> dict[str, Path]:
    """Write the synthetic data sets ``keys`` (all by default) under ``root``; returns their roots."""
    roots = {}
    for key in sorted(keys if keys is not None else DATA):
        _invoke(synth_args(key, root))
        roots[key] = root / key
    return roots


def run_golden(run: GoldenRun, roots: dict[str, Path], out: Path) -> dict[str, Any]:
    """Run one golden command with one thread; returns its normalised results.json."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _invoke(run.args(roots, out))
    finally:
        torch.set_num_threads(threads)
    return normalised(out, roots)
