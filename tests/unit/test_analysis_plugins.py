"""docs/extending.md's external route, end to end through the command line: the user's module of analyses
named with ``--import`` (a file or a dotted name), under ``import:`` in a config file, or installed as a package
with a ``vitscope.analyses`` entry point; ``vitscope analyses`` and ``analyze --help`` list it; a module that
cannot be imported is one line naming it."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import tomllib
import torch
from PIL import Image

from helpers.cli import cli
from helpers.plugin_lab import fenced


def install(folder: Path, entry_points: dict[str, str], monkeypatch) -> None:
    """A distribution ``my-lab`` installed in ``folder`` (put on Python's path) with these analysis entry points."""
    info = folder / "my_lab-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-lab\nVersion: 0.1\n")
    lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[vitscope.analyses]\n{lines}")
    monkeypatch.syspath_prepend(str(folder))


def mean_norm_by_hand(block: int) -> float:
    import vitscope

    backbone = vitscope.load_model("tiny-vit")
    images = [Image.open(p).convert("RGB") for p in sorted(Path("photos").iterdir())]
    with torch.no_grad(), backbone.record(f"blocks.{block}.resid_post") as rec:
        backbone(backbone.preprocess(images))
    return float(rec[f"blocks.{block}.resid_post"].double().norm(dim=-1).mean())


def test_the_doc_commands_run_and_list_the_module_they_import(lab):
    analyze, listing = [shlex.split(line) for line in fenced("bash", "vitscope analyze --import "
                                                                      "my_lab/token_norm.py -m tiny-vit -d photos/ -o "
                                                                      "runs/norms -a token_norm -p token_norm.block=3"
                                                             ).splitlines()]
    run = cli(*analyze[1:])
    assert run.returncode == 0, run.stderr
    doc = json.loads((lab / "runs" / "norms" / "results.json").read_text())
    assert list(doc["analyses"]) == ["token_norm"] and doc["hooks"] == ["blocks.3.resid_post"]
    assert doc["analyses"]["token_norm"]["summary"]["mean_norm"] == pytest.approx(mean_norm_by_hand(3), rel=1e-6)
    import hashlib

    (source,) = doc["config"]["imports"]  # the code that made the numbers, with the file's digest
    assert source["analysis"] == "token_norm" and source["file"].endswith("token_norm.py")
    assert source["sha256"] == hashlib.sha256(Path(source["file"]).read_bytes()).hexdigest()

    shown = cli(*listing[1:])  # the same file, now by its dotted name: one class, imported twice
    assert shown.returncode == 0, shown.stderr
    listed = {entry["name"]: entry for entry in json.loads(shown.stdout)}
    assert listed["token_norm"]["plugin"] and listed["token_norm"]["module"] == "my_lab.token_norm"
    assert listed["token_norm"]["summary"] == "Mean and largest norm of the tokens leaving block 0"
    assert listed["token_norm"]["groups"] == [] and listed["token_norm"]["default"]
    assert not listed["cka"]["plugin"] and listed["saliency_iou"]["needs"] == ["attention", "masks"]
    assert list(listed)[-1] == "token_norm"  # without an order: after the built-ins


def test_compare_records_the_source_of_the_plugin_analyses_each_model_ran(lab):
    run = cli("compare", "--import", "my_lab/token_norm.py", "-M", "tiny-vit,sup=tiny-vit-sup", "-d", "photos/",
              "-o", "runs/pair", "-a", "token_norm")
    assert run.returncode == 0, run.stderr
    doc = json.loads((lab / "runs" / "pair" / "results.json").read_text())
    assert {"token_norm@tiny-vit", "token_norm@sup"} <= set(doc["analyses"])
    (source,) = doc["config"]["imports"]  # one record: both models ran the same class
    assert source["analysis"] == "token_norm" and source["module"] == "token_norm"  # imported from its file
    assert source["file"].endswith("token_norm.py") and len(source["sha256"]) == 64


def test_a_config_file_imports_the_modules_it_names(lab):
    config = fenced("yaml", "# norms.yaml: vitscope analyze --config norms.yaml")
    (lab / "norms.yaml").write_text(config)
    command = shlex.split(config.splitlines()[0].partition(": ")[2])
    run = cli(*command[1:])
    assert run.returncode == 0, run.stderr
    doc = json.loads((lab / "runs" / "norms-late" / "results.json").read_text())
    assert list(doc["analyses"]) == ["token_norm"] and doc["hooks"] == ["blocks.2.resid_post"]


def test_an_installed_package_adds_its_analyses_through_the_entry_point(lab, monkeypatch):
    table = tomllib.loads(fenced("toml", "# pyproject.toml of the package my-lab"))
    install(lab, table["project"]["entry-points"]["vitscope.analyses"], monkeypatch)
    shown = cli("analyses", "--json")  # no --import
    assert shown.returncode == 0, shown.stderr
    listed = {entry["name"]: entry for entry in json.loads(shown.stdout)}
    assert listed["token_norm"]["module"] == "my_lab.token_norm"
    params = cli("analyze", "--params-of", "token_norm")
    assert params.returncode == 0 and "block = 0" in params.stdout


def test_the_registry_imports_the_entry_points_on_its_first_read(lab, monkeypatch):
    from vitscope.analyses import registry

    install(lab, {"token_norm": "my_lab.token_norm"}, monkeypatch)
    monkeypatch.setattr(registry, "_LOADED", False)  # as in a fresh process
    assert registry.ANALYSES["token_norm"].__module__ == "my_lab.token_norm"


def test_a_broken_entry_point_stops_every_read_and_the_others_still_register(lab, monkeypatch):
    """The first read raised the broken one's error and left the registry loaded without the entry points after it,
    so a second read in the same process said 'unknown analysis' for a working plug-in."""
    from vitscope.analyses import registry
    from vitscope.analyses.plugins import PluginImportError

    install(lab, {"a_bad": "my_lab.nothere", "token_norm": "my_lab.token_norm"}, monkeypatch)
    monkeypatch.setattr(registry, "_LOADED", False)  # as in a fresh process
    monkeypatch.setattr(registry, "_BROKEN", [])
    for _ in range(2):
        with pytest.raises(PluginImportError, match="entry point 'a_bad = my_lab.nothere'"):
            registry.ANALYSES["token_norm"]
    assert registry._ANALYSES["token_norm"].__module__ == "my_lab.token_norm"  # imported all the same


def test_help_and_params_of_know_the_imported_analyses_wherever_import_stands(lab):
    shown = cli("analyze", "--help", "--import", "my_lab/token_norm.py")  # after --help: imported first all the same
    assert shown.returncode == 0
    line = next(line for line in shown.stdout.splitlines() if line.strip().startswith("token_norm "))
    assert line.endswith("(from token_norm)") and "Mean and largest norm" in line
    params = cli("analyze", "--params-of", "token_norm", "--import", "my_lab.token_norm")
    assert params.returncode == 0 and "block = 0" in params.stdout


@pytest.mark.parametrize(("given", "why"), [
    ("my_lab/missing.py", "no such file"),
    ("my_lab.nope", "no module named 'my_lab.nope' (on Python's path or in the current folder)"),
    ("my_lab/broken.py", "RuntimeError: boom"),
    ("my_lab.clash", "analysis name 'cka' is already registered by vitscope.analyses.representation.cka.BlockCKA"),
])
def test_a_module_that_cannot_be_imported_is_one_line_naming_it(lab, given, why):
    (lab / "my_lab" / "broken.py").write_text("raise RuntimeError('boom')\n")
    module = fenced("python", "# my_lab/token_norm.py")
    (lab / "my_lab" / "clash.py").write_text(module.replace('"token_norm"', '"cka"'))
    for command in (["analyses"], ["models"], ["zoo", "list"]):  # every command takes --import
        run = cli(*command, "--import", given)
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 1 and lines == [f"error: cannot import analyses from '{given}': {why}"], run.stderr


def test_an_entry_point_that_cannot_be_imported_is_named_and_help_still_lists_the_built_ins(lab, monkeypatch):
    install(lab, {"broken": "my_lab.nope"}, monkeypatch)
    run = cli("analyses")
    assert run.returncode == 1 and run.stderr.strip().splitlines() == [
        "error: cannot import the analyses of entry point 'broken = my_lab.nope' of my-lab 0.1: "
        "ModuleNotFoundError: No module named 'my_lab.nope'"]
    shown = cli("analyze", "--help")
    assert shown.returncode == 0 and "Plug-in analyses are not listed: cannot import the analyses of entry point " \
        "'broken = my_lab.nope'" in shown.stdout and "  cls_attention_maps " in shown.stdout


def test_a_record_of_an_installed_plugin_runs_again_without_import(lab, monkeypatch):
    """An installed package's plug-in counts as given: its record ran again before a record stopped importing, and
    was refused after (the entry points are imported on the registry's first read, after the config file)."""
    import sys

    from vitscope.analyses import registry

    install(lab, {"token_norm": "my_lab.token_norm"}, monkeypatch)
    monkeypatch.setattr(registry, "_LOADED", False)  # as in a fresh process
    first = cli("analyze", "-m", "tiny-vit", "-d", "photos", "-o", "first", "-a", "token_norm")
    assert first.returncode == 0, first.stderr
    monkeypatch.delitem(sys.modules, "my_lab.token_norm")  # and again
    monkeypatch.setattr(registry, "_LOADED", False)
    again = cli("analyze", "--config", "first/results.json", "-o", "again")
    assert again.returncode == 0, again.stderr
    assert json.loads(Path("again/results.json").read_text())["analyses"]["token_norm"] == \
        json.loads(Path("first/results.json").read_text())["analyses"]["token_norm"]
