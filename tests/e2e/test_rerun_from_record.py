"""``--config OLD/results.json`` runs a run again: its record is a config file of the same command, and the numbers
are the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers.plugin_lab import fenced
from vitscope.cli.main import app
from vitscope.data.synthetic.write import synthesize

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def coco(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"{synthesize(tmp_path_factory.mktemp('rerun') / 'coco', 'coco', n=8, size=64, seed=4)}::coco"


def _invoke(*args: str):
    proc = CliRunner().invoke(app, list(args))
    assert proc.exit_code == 0, proc.stderr
    return proc


def _analyses(folder: Path) -> dict:
    return json.loads((folder / "results.json").read_text())["analyses"]


@pytest.mark.parametrize("command", [
    ["analyze", "-m", "tiny-vit", "-a", "attention_stats,cka@cls", "-p", "cka.batch=4", "-b", "3", "--limit", "6",
     "--image-size", "48"],
    ["probe", "-m", "tiny-vit-sup", "--test-fraction", "0.5", "--seed", "2", "--blocks", "1,-1", "-b", "5"],
    ["compare", "-M", "a=tiny-vit,b=tiny-vit-p16", "-a", "attention_distance", "--limit", "6"]])
def test_a_runs_record_runs_it_again(coco: str, tmp_path: Path, command: list[str]) -> None:
    """The probe's record held its detected format and task, which a config file did not take."""
    first, again = tmp_path / "first", tmp_path / "again"
    extra = ["--cache", str(tmp_path / "cache")] if command[0] == "probe" else []
    _invoke(*command, "-d", coco, "-o", str(first), *extra)
    _invoke(command[0], "--config", str(first / "results.json"), "-o", str(again))
    assert _analyses(again) == _analyses(first)


@pytest.mark.usefixtures("clean_registry")
def test_a_plugin_runs_record_imports_its_module_again(coco: str, tmp_path: Path) -> None:
    """The record holds its imports as {analysis, module, file, sha256}, which a config file did not take."""
    import subprocess
    import sys

    module = tmp_path / "token_norm_for_rerun.py"
    module.write_text(fenced("python", "# my_lab/token_norm.py"))  # docs/extending.md's plug-in
    first, again = tmp_path / "first", tmp_path / "again"
    _invoke("analyze", "-m", "tiny-vit", "-d", coco, "-o", str(first), "--import", str(module), "-a",
            "token_norm", "--limit", "4")
    rerun = [sys.executable, "-m", "vitscope", "analyze", "--config", str(first / "results.json"), "-o", str(again)]
    fresh = subprocess.run([*rerun, "--import", str(module)], capture_output=True, text=True)  # a fresh process
    assert fresh.returncode == 0, fresh.stderr
    assert _analyses(again)["token_norm"] == _analyses(first)["token_norm"]
    module.write_text(module.read_text() + "\n# edited since\n")
    changed = _invoke("analyze", "--config", str(first / "results.json"), "-o", str(again))
    assert f"warning: {module} is not the file of the run recorded in" in changed.stderr, changed.stderr


def test_a_record_given_to_another_command_says_whose_it_is(coco: str, tmp_path: Path) -> None:
    _invoke("compare", "-M", "tiny-vit,tiny-vit-p16", "-a", "attention_stats", "-d", coco, "--limit", "4", "-o",
            str(tmp_path / "c"))
    proc = CliRunner().invoke(app, ["analyze", "--config", str(tmp_path / "c" / "results.json"), "-o",
                                    str(tmp_path / "a")])
    assert proc.exit_code == 2 and "the record of a 'vitscope compare' run" in proc.stderr, proc.stderr


@pytest.mark.usefixtures("clean_registry")
def test_a_plugin_of_a_package_is_imported_again_by_its_module_name(coco: str, tmp_path: Path, monkeypatch) -> None:
    """A record of a package's module runs again with the module given by its dotted name (imported alone, its
    file failed on its relative import). The first run is a process of its own, as a user's would be."""
    import subprocess
    import sys

    package = tmp_path / "pkg_lab_for_rerun"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "scale.py").write_text("SCALE = 1\n")
    (package / "token_norm.py").write_text("from .scale import SCALE  # noqa: F401\n" +
                                           fenced("python", "# my_lab/token_norm.py"))
    monkeypatch.chdir(tmp_path)
    fresh = [sys.executable, "-m", "vitscope", "analyze"]
    first = subprocess.run([*fresh, "-m", "tiny-vit", "-d", coco, "-o", "first", "--import",
                            "pkg_lab_for_rerun.token_norm", "-a", "token_norm", "--limit", "4"],
                           capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    _invoke("analyze", "--config", "first/results.json", "-o", "again", "--import", "pkg_lab_for_rerun.token_norm")
    assert _analyses(tmp_path / "again")["token_norm"] == _analyses(tmp_path / "first")["token_norm"]
