"""The README stands alone in a user's clone: every ``bash`` and ``python`` block runs as written (``text`` blocks
are synopses or long runs tested elsewhere), and nothing points outside the repository."""

from __future__ import annotations

import re
import shlex
import textwrap
from pathlib import Path

import pytest

from helpers.cli import cli

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCK = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", flags=re.MULTILINE | re.DOTALL)


def _blocks(language: str) -> list[str]:
    return [textwrap.dedent(body) for _, lang, body in BLOCK.findall(README.read_text()) if lang == language]


def test_every_block_says_what_it_is_and_nothing_points_outside_the_clone():
    text = README.read_text()
    languages = {lang for _, lang, _ in BLOCK.findall(text)}
    assert languages <= {"bash", "python", "text"} and "" not in languages, languages
    assert "../shared" not in text and "METHODS.md" not in text and "DESIGN.md" not in text
    for link in re.findall(r"\]\(([^)#]+)\)", text) + re.findall(r"`(docs/[\w./-]+)`", text):
        if not link.startswith(("http://", "https://")):
            assert (README.parent / link).exists(), link


def test_the_shell_blocks_run_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    commands = [line for block in _blocks("bash") for line in block.splitlines() if line.strip()]
    assert commands
    for line in commands:
        words = shlex.split(line)
        assert words[0] == "vitscope", f"README bash blocks run vitscope commands only: {line}"
        result = cli(*words[1:])
        assert result.returncode == 0, f"{line}\n{result.stderr}"
    assert Path("out/report.html").is_file() and Path("pair/report.html").is_file()


@pytest.mark.parametrize("index", range(len(_blocks("python"))))
def test_the_python_blocks_run_as_written(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(_blocks("python")[index], f"README.md python block {index}", "exec"), {"__name__": "__readme__"})


def test_the_probe_synopsis_offers_only_options_its_data_takes(tmp_path):
    """Each ``vitscope probe`` line of the synopsis runs on a small world of its format with its ``--tiling`` and
    ``--blocks`` options (the probe refuses tiling on revisitop: the synopsis must not offer it there)."""
    from vitscope.data.synthetic.write import synthesize

    lines = [line for block in _blocks("text") for line in block.splitlines() if line.startswith("vitscope probe ")]
    assert lines
    for k, line in enumerate(lines):
        model = re.search(r"--model (\S+)", line).group(1)
        fmt = re.search(r"--data \S*::(\w+)", line).group(1)
        options = [word for option in re.findall(r"\[(--(?:tiling|blocks) [^\]]+)\]", line) for word in option.split()]
        root = synthesize(tmp_path / f"world{k}", fmt, n=2 if fmt == "davis" else 6, size=48, seed=k)
        result = cli("probe", "--model", model, "--data", f"{root}::{fmt}", "--out", str(tmp_path / f"probe{k}"),
                     "--device", "cpu", "--no-resume", *options)
        assert result.returncode == 0, f"{line}\n{result.stderr}"
