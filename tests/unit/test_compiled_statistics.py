"""The shared attention statistics through ``torch.compile`` (``compile_stats``): the same numbers as op by op
within float32 rounding, one compilation for every batch size, a plain fallback where compiling fails, and what
a run and the command line record.

The suite traces with the ``aot_eager`` backend (graph capture, functionalisation, the dynamic batch: about a
second); inductor's fused kernels take 15-25 s to compile cold on two cores, so ``make compile-check`` runs the
same tests with it (``VITSCOPE_COMPILE_CHECK=1``)."""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch

import vitscope
from vitscope.analyses.attention.suite import attention_suite
from vitscope.analyses.batch import union_plan
from vitscope.functional import compiled
from vitscope.functional.attention_blocks import block_statistics

# the suite's union plan on tiny-vit, so this compilation is the one the run below reuses
_BACKBONE = vitscope.load_model("tiny-vit")
_NEEDS = union_plan([a.shared_quantities(_BACKBONE.spec) for a in attention_suite(_BACKBONE.spec)])[
    "attention_blocks"]
_FIELDS = ("cls", "colsum", "rowsum", "aligned", "entropy", "focus", "peak")
_INDUCTOR = pytest.mark.skipif(not os.environ.get("VITSCOPE_COMPILE_CHECK"),
                               reason="make compile-check compiles with inductor (15-25 s cold)")


@pytest.fixture(params=["aot_eager", pytest.param("inductor", marks=_INDUCTOR)])
def backend(request, monkeypatch) -> str:
    monkeypatch.setattr(compiled, "BACKEND", request.param)
    return request.param


def _close(eager, fused, rtol: float = 2e-6) -> None:
    for name in _FIELDS:
        a, b = getattr(eager, name), getattr(fused, name)
        assert (a is None) == (b is None), name
        if a is not None:
            torch.testing.assert_close(b, a, rtol=rtol, atol=rtol * float(a.abs().max()), msg=name)
    assert eager.fused.keys() == fused.fused.keys()
    for mode in eager.fused:
        torch.testing.assert_close(fused.fused[mode], eager.fused[mode], rtol=rtol, atol=1e-7)


def _patterns(batch: int, grid: tuple[int, int], prefix: int, seed: int) -> torch.Tensor:
    n = prefix + grid[0] * grid[1]
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, 3, n, n, generator=gen) * 4
    logits[0, 0, 2] = -torch.inf  # a row with every key but one masked out: a one-hot row
    logits[0, 0, 2, 0] = 0.0
    return logits.softmax(dim=-1)


def test_compiled_statistics_equal_the_op_by_op_ones_at_every_batch_size(backend) -> None:
    grid, prefix = _BACKBONE.spec.grid_for(*_BACKBONE.spec.image_size), _BACKBONE.spec.num_prefix_tokens
    with warnings.catch_warnings():
        warnings.simplefilter("error", compiled.CompileFallbackWarning)
        for batch, seed in ((5, 0), (2, 1), (7, 2)):  # the batch dimension is dynamic: one compilation for all
            pattern = _patterns(batch, grid, prefix, seed)
            fused = block_statistics(pattern, grid, prefix, _NEEDS, compiled=True)
            _close(block_statistics(pattern, grid, prefix, _NEEDS), fused)
    key = (block_statistics.__globals__["_dense"], backend, (("needs", frozenset(_NEEDS)), ("p", prefix)))
    assert compiled._CACHE[key].compiled is not None  # it compiled, rather than falling back to the same maths


def test_a_run_with_compile_stats_equals_the_default_run_and_says_so(backend) -> None:
    runs = {c: vitscope.run(_BACKBONE, "skimage", attention_suite(_BACKBONE.spec), batch_size=4, limit=6,
                            progress=False, workers=0, compile_stats=c) for c in (False, True)}
    assert runs[True].compile_stats is True and runs[False].compile_stats is False
    compared = 0
    for name, result in runs[False].items():
        for key, value in result.tensors.items():
            other = runs[True][name].tensors[key]
            if value.is_floating_point():
                torch.testing.assert_close(other, value, rtol=1e-5, atol=1e-6 * float(value.abs().max()),
                                           msg=f"{name}.{key}")
            else:
                assert torch.equal(other, value), f"{name}.{key}"
            compared += 1
    assert compared > 20


def _broken(fn, **kwargs):
    """``torch.compile`` on a machine without a C++ compiler: the compiled function fails when called."""
    def call(*args, **kw):
        raise RuntimeError("no C++ compiler\nsecond line")
    return call


def test_where_compiling_fails_it_warns_and_computes_the_same_statistics(monkeypatch) -> None:
    monkeypatch.setattr(compiled, "_CACHE", {})
    monkeypatch.setattr(torch, "compile", _broken)
    pattern = _patterns(3, (2, 3), 1, 0)
    with pytest.warns(compiled.CompileFallbackWarning, match=r"RuntimeError: no C\+\+ compiler\); running it op"):
        fused = block_statistics(pattern, (2, 3), 1, {"entropy", "focus", "aligned"}, compiled=True)
    _close(block_statistics(pattern, (2, 3), 1, {"entropy", "focus", "aligned"}), fused, rtol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once: later calls go straight to the plain maths
        block_statistics(pattern, (2, 3), 1, {"entropy", "focus", "aligned"}, compiled=True)


def test_the_command_line_records_it_and_keys_the_state_by_it(tmp_path, monkeypatch) -> None:
    from typer.testing import CliRunner

    from vitscope.cli.main import app

    monkeypatch.setattr(compiled, "_CACHE", {})
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)  # the plumbing, not the compiler, is tested here
    keys = []
    from vitscope.engine import run as engine_run

    real = engine_run.run_checkpoint
    monkeypatch.setattr(engine_run, "run_checkpoint", lambda *a, **kw: keys.append(kw) or real(*a, **kw))
    for flag in ("--no-compile-stats", "--compile-stats"):
        out = tmp_path / flag
        result = CliRunner().invoke(app, ["analyze", "--model", "tiny-vit", "--data", "skimage", "--limit", "2",
                                          "--analyses", "attention_stats", "--out", str(out), flag, "--workers", "0"])
        assert result.exit_code == 0, result.output
        saved = json.loads((out / "results.json").read_text())
        assert saved["config"]["compile_stats"] is (flag == "--compile-stats")
    assert "compile_stats" not in keys[0] and keys[1]["compile_stats"] is True  # op-by-op keys stay as they were


def test_a_pass_whose_compiling_failed_says_it_ran_op_by_op(monkeypatch) -> None:
    """The fallback only warned: Results.compile_stats and results.json said the statistics ran compiled."""
    import numpy as np

    from vitscope.engine.results import run_record

    monkeypatch.setattr(compiled, "_CACHE", {})
    monkeypatch.setattr(torch, "compile", _broken)
    images = [np.full((32, 32, 3), 30 * i, dtype=np.uint8) for i in range(4)]
    backbone = vitscope.load_model("tiny-vit")
    for _ in range(2):  # the second pass runs op by op without a new warning: it says so too
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", compiled.CompileFallbackWarning)
            ran = vitscope.run(backbone, images, ["attention_stats"], batch_size=2, device="cpu", progress=False,
                               compile_stats=True)
        assert ran.compile_stats is False and "RuntimeError: no C++ compiler" in ran.compile_fallback
        assert run_record(ran)["compile_fallback"] == ran.compile_fallback
    plain = vitscope.run(backbone, images, ["attention_stats"], batch_size=2, device="cpu", progress=False)
    assert plain.compile_fallback is None and "compile_fallback" not in run_record(plain)


@pytest.mark.parametrize("command", [["analyze", "-m", "tiny-vit"], ["compare", "-M", "tiny-vit,tiny-vit-p16"]])
def test_a_command_whose_compiling_failed_writes_its_results_and_says_so(monkeypatch, tmp_path, command) -> None:
    """The writer took no compile_fallback: analyze and compare failed after their pass with a TypeError."""
    from typer.testing import CliRunner

    from vitscope.cli.main import app

    monkeypatch.setattr(compiled, "_CACHE", {})
    monkeypatch.setattr(torch, "compile", _broken)
    out = tmp_path / "out"
    proc = CliRunner().invoke(app, [*command, "-d", "skimage", "--limit", "2", "-a", "attention_stats", "-o",
                                    str(out), "--compile-stats", "--workers", "0"])
    assert proc.exit_code == 0, proc.stderr
    run = json.loads((out / "results.json").read_text())["run"]
    assert "RuntimeError: no C++ compiler" in run["compile_fallback"]
    assert "ran op by op: compiling failed (_dense (RuntimeError: no C++ compiler)" in (out / "report.html").read_text()


def test_every_key_of_the_run_record_is_a_field_the_writer_takes() -> None:
    import dataclasses
    from types import SimpleNamespace

    from vitscope.engine.results import run_record
    from vitscope.outputs import RunResult

    passes = SimpleNamespace(resumed_images=0, earlier_parts=[], workers=0, processes=1, timing=lambda: None,
                             compile_fallback="f (RuntimeError: x)")
    assert set(run_record(passes)) <= {f.name for f in dataclasses.fields(RunResult)}
