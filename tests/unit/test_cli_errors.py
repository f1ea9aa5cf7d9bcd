"""How a command ends: vitscope's own errors and the machine's are one line; anything else is a reported bug."""

from __future__ import annotations

import errno

import pytest
import torch
import typer
from typer.testing import CliRunner

from vitscope import VitscopeError
from vitscope.cli.errors import one_line_errors
from vitscope.errors import VitscopeFileNotFoundError, VitscopeTypeError, VitscopeValueError


def _run(exc: BaseException):
    app = typer.Typer()

    @app.command()
    @one_line_errors
    def go() -> None:
        raise exc

    @app.command()
    def other() -> None:  # a second command, so typer keeps the command name
        pass

    return CliRunner().invoke(app, ["go"])


@pytest.mark.parametrize("exc", [VitscopeValueError("bad --param k=x: k is a whole number\nmore detail"),
                                 VitscopeTypeError("not a model"), VitscopeFileNotFoundError("no such folder: x"),
                                 VitscopeError("plain")])
def test_vitscope_errors_are_one_line_and_status_1(exc) -> None:
    result = _run(exc)
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [f"error: {str(exc).splitlines()[0]}"]
    assert "Traceback" not in result.output


@pytest.mark.parametrize("exc", [OSError(errno.ENOSPC, "No space left on device", "/out/results.json"),
                                 PermissionError(errno.EACCES, "Permission denied", "/out")])
def test_the_machine_saying_no_is_one_line_naming_the_path(exc) -> None:
    result = _run(exc)
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert result.output.startswith("error: [Errno") and "/out" in result.output


@pytest.mark.parametrize("exc", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                                 RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate "
                                              "memory: you tried to allocate 9663676416 bytes")])
def test_out_of_memory_is_one_line_with_advice_that_works(exc, tmp_path, monkeypatch) -> None:
    """The advice names half the batch size the pass really had: the default, a --config value or -b."""
    import vitscope.workflows.analyze as analyze_workflow
    from vitscope.cli.main import app

    def exhausted(options, log=None):
        raise exc

    monkeypatch.setattr(analyze_workflow, "analyze_command", exhausted)
    base = ["analyze", "-m", "tiny-vit", "-d", str(tmp_path), "-o", str(tmp_path / "out")]
    config = tmp_path / "run.yaml"
    config.write_text("batch_size: 32\n")
    lines = {case: CliRunner().invoke(app, base + extra).output.strip().splitlines()
             for case, extra in {"default": [], "config": ["--config", str(config)], "one": ["-b", "1"]}.items()}
    assert lines["default"] == [
        "error: out of memory at a batch of 16; run again with a smaller batch (--batch-size / -b 8): no number "
        "depends on the batch size, and the saved state resumes at any size"]
    assert lines["config"][0].startswith("error: out of memory at a batch of 32; run again with a smaller batch "
                                         "(--batch-size / -b 16)")
    assert lines["one"] == ["error: out of memory at one image a batch; run again with a smaller input "
                            "(--image-size) or fewer analyses (--analyses) (finished work and the saved state stay "
                            "on disk)"]
    other = _run(exc)  # a command with no pass of its own: no promise about batch sizes
    assert other.exit_code == 1 and "Traceback" not in other.output
    assert other.output.strip() == "error: out of memory; run again with a smaller input (--image-size) where the " \
                                   "command has it"


def test_ctrl_c_is_status_130() -> None:
    result = _run(KeyboardInterrupt())
    assert result.exit_code == 130 and result.output.strip() == "interrupted"


@pytest.mark.parametrize("exc", [KeyError("blocks.3"), ValueError("a plain ValueError from a library"),
                                 TypeError("unsupported operand"), AttributeError("no attribute x")])
def test_anything_else_is_a_bug_with_its_traceback(exc) -> None:
    result = _run(exc)
    assert result.exit_code == 1
    assert "Traceback (most recent call last)" in result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("error: this is a bug in vitscope") and type(exc).__name__ in last


def test_typer_usage_errors_keep_status_2() -> None:
    result = _run(typer.BadParameter("not a number"))
    assert result.exit_code == 2


def test_vitscope_warnings_are_one_line_and_other_libraries_keep_their_format(monkeypatch, capsys) -> None:
    """Every warning vitscope issues has a class of its own (three were plain UserWarnings, printed with Python's
    file, line and source); a plain UserWarning is another library's, even when attributed to a vitscope frame
    (torch warns from C++ or with stacklevel=2), and keeps Python's format."""
    import warnings

    import vitscope.analyses.probes.base as probes_base
    from vitscope.cli.errors import one_line_warnings
    from vitscope.errors import VitscopeWarning

    theirs: list[str] = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, category, filename, *rest: theirs.append(filename))
    one_line_warnings()
    warnings.showwarning(VitscopeWarning("knn_probe: images without a class label are left out"), VitscopeWarning,
                         probes_base.__file__, 201)
    warnings.showwarning(UserWarning("The given NumPy array is not writable"), UserWarning, probes_base.__file__, 20)
    assert capsys.readouterr().err.splitlines() == ["warning: knn_probe: images without a class label are left out"]
    assert theirs == [probes_base.__file__]


def test_every_warning_vitscope_issues_has_a_class_of_its_own() -> None:
    import ast
    import builtins
    from pathlib import Path

    import vitscope

    plain = {name for name in dir(builtins) if name.endswith("Warning")}
    found = []
    for path in sorted(Path(vitscope.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "warn"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "warnings"):
                continue
            given = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "category"), None)
            if given is None and node.args and isinstance(node.args[0], ast.Call):
                given = node.args[0].func  # warnings.warn(SomeWarning(...))
            name = ast.unparse(given) if given is not None else "UserWarning"
            if name.split(".")[-1] in plain or not name.endswith("Warning"):
                found.append(f"{path.name}:{node.lineno}: {name}")
    assert not found, found
