"""The ``analyze`` path: one options object from parsing to the workflow, one Source per run, one way to build a
checkpoint (the CLI and ``vitscope.run(resume=...)`` alike)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import vitscope
from helpers.cli import cli
from helpers.images import random_pngs
from vitscope.errors import VitscopeValueError
from vitscope.workflows.options import (
    AnalyzeOptions,
    CompareOptions,
    PassOptions,
    ProbeOptions,
    option_table,
    resolve,
)


class _Stop(VitscopeValueError):
    """Ends a command once the workflow has been handed its options."""


@pytest.fixture
def handed(monkeypatch) -> list:
    """The options objects the analyze workflow receives (it stops there: nothing runs)."""
    import vitscope.workflows.analyze as workflow

    seen: list = []

    def receive(options, **runtime):
        seen.append(options)
        raise _Stop("stopped")

    monkeypatch.setattr(workflow, "run_analyze", receive)
    return seen


def test_the_workflow_receives_one_object_with_the_yaml_and_command_line_merged(tmp_path, handed) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("model: tiny-vit\ndata: photos\nlimit: 3\nbatch-size: 8\nresume: false\n"
                      "params: {attention_distance: {seed: 5}}\n")
    result = cli("analyze", "-c", str(config), "-o", str(tmp_path / "out"), "-b", "4", "-a", "attention_distance",
                 "-p", "attention_distance.random_samples=2", "--figure-files")
    assert result.returncode == 1 and result.stderr.strip() == "error: stopped"
    expected = AnalyzeOptions(model="tiny-vit", data="photos", out=tmp_path / "out", analyses=["attention_distance"],
                              params={"attention_distance": {"seed": 5, "random_samples": "2"}},  # both, merged
                              limit=3, batch_size=4, resume=False, figure_files=True, config_file=str(config))
    assert handed == [expected]  # batch size: the command line over the file; the rest as given, else defaults
    assert handed[0].strict is False and handed[0].checkpoint_seconds == 60.0 and handed[0].device is None


def test_the_library_call_builds_the_same_object_from_its_keywords(tmp_path, handed) -> None:
    with pytest.raises(_Stop):
        vitscope.analyze("tiny-vit", "photos", ["attention_distance"], out=tmp_path / "out", batch_size=4, limit=3,
                         resume=False, figure_files=True, params={"attention_distance": {"seed": 5}})
    assert handed == [AnalyzeOptions(model="tiny-vit", data="photos", out=tmp_path / "out",
                                     analyses=["attention_distance"], params={"attention_distance": {"seed": 5}},
                                     limit=3, batch_size=4, resume=False, figure_files=True)]


def test_one_source_and_one_checkpoint_function_per_run(tmp_path, monkeypatch) -> None:
    """The CLI opens its data once, and its state goes through the function behind ``vitscope.run(resume=...)``."""
    import vitscope.engine.run as engine_run
    import vitscope.workflows.analyze as workflow
    from vitscope.data.open import as_source
    from vitscope.engine.state import run_checkpoint

    opened: list = []
    keyed: list = []

    def counted_source(data, strict=False):
        opened.append(data)
        return as_source(data, strict=strict)

    def counted_checkpoint(path, *args, **kwargs):
        keyed.append(Path(path))
        return run_checkpoint(path, *args, **kwargs)

    for module in (workflow, engine_run):  # every place a run of analyze may open its data
        monkeypatch.setattr(module, "as_source", counted_source)
    monkeypatch.setattr(engine_run, "run_checkpoint", counted_checkpoint)
    photos = random_pngs(tmp_path / "photos", [(32, 32)] * 3)
    out = tmp_path / "out"
    result = cli("analyze", "-m", "tiny-vit", "-d", str(photos), "-o", str(out), "-a", "attention_stats", "-b", "2")
    assert result.returncode == 0, result.stderr
    assert opened == [str(photos)]
    assert keyed == [out / ".vitscope-state" / "tiny-vit.pt"]

    keyed.clear()
    backbone = vitscope.load_model("tiny-vit")
    vitscope.run(backbone, str(photos), ["attention_stats"], batch_size=2, resume=tmp_path / "state.pt")
    assert keyed == [tmp_path / "state.pt"]

    keyed.clear()  # --no-resume keeps no state: no checkpoint at all
    assert cli("analyze", "-m", "tiny-vit", "-d", str(photos), "-o", str(out), "-a", "attention_stats",
               "--no-resume").returncode == 0
    assert keyed == []


def test_every_command_shares_the_pass_options_in_one_order() -> None:
    shared = [f.name for f in dataclasses.fields(PassOptions) if f.metadata]
    assert shared[:3] == ["data", "out", "limit"] and "config_file" not in shared
    for kind, own in ((AnalyzeOptions, ["model", "analyses", "params", "compile_stats"]),
                      (CompareOptions, ["models", "analyses", "params", "compile_stats", "cka_estimator"]),
                      (ProbeOptions, ["model", "test_data", "test_fraction", "tiling", "blocks", "site", "seed",
                                      "cache", "davis_void"])):
        assert [o.name for o in option_table(kind)] == own + shared, kind.__name__


def test_the_record_keeps_the_table_order_and_makes_choices_explicit(tmp_path) -> None:
    options = resolve(AnalyzeOptions, {"model": "m", "data": "d", "out": str(tmp_path), "analyses": "a,b"})
    record = options.record(analyses=["a", "b@x"])
    assert record == {"model": "m", "analyses": ["a", "b@x"], "params": None, "compile_stats": False, "data": "d",
                      "out": str(tmp_path),
                      "limit": None, "batch_size": 16, "device": "auto", "dtype": "fp32", "strict": False,
                      "resume": True, "checkpoint_seconds": 60.0, "figure_files": False, "image_size": None,
                      "keep_aspect": False,
                      "workers": None, "jpeg_draft": False}
    assert list(record)[:5] == ["model", "analyses", "params", "compile_stats", "data"]


def test_probe_options_the_model_cannot_take_are_bad_usage_in_one_line(tmp_path) -> None:
    photos = random_pngs(tmp_path / "photos", [(32, 32)] * 2)
    tiling = cli("probe", "-m", "tiny-vit", "-d", str(photos), "-o", str(tmp_path / "a"), "--tiling", "0.5")
    assert tiling.returncode == 2 and tiling.stderr.strip() == "error: --tiling must be 0 (off) or a scale >= 1, " \
                                                               "got 0.5"
    blocks = cli("probe", "-m", "tiny-vit", "-d", str(photos), "-o", str(tmp_path / "b"), "--blocks", "0,9")
    assert blocks.returncode == 2  # tiny-vit has 6 blocks: checked once it is loaded, before any data is read
    said = blocks.stderr.strip().splitlines()  # the model's input line, then the error
    assert said[-1] == "error: --blocks '0,9': the model has blocks 0..5 (negative counts from the end)"
    assert len(said) == 2 and said[0].startswith("tiny-vit: input")
