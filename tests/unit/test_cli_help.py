"""``vitscope ... --help`` suffices: flags read as flags, required options say so, and ``analyze --help`` lists
every analysis with its group, what it needs and whether it runs by default (kept in step with the registry)."""

from __future__ import annotations

from typer.testing import CliRunner

from vitscope.analyses import ANALYSES, GROUPS
from vitscope.cli.help_text import ANALYSES_BY_GROUP
from vitscope.cli.main import app


def _help(*command: str) -> str:
    result = CliRunner().invoke(app, [*command, "--help"], terminal_width=120)
    assert result.exit_code == 0
    return result.output


def test_the_help_lists_every_registered_analysis_under_its_group():
    listed = [name for members in ANALYSES_BY_GROUP.values() for name, _, _ in members]
    assert sorted(listed) == sorted(ANALYSES) and len(set(listed)) == len(listed)
    first_group = {}
    for group, members in GROUPS.items():
        for name in members:
            first_group.setdefault(name, group)
    for group, members in ANALYSES_BY_GROUP.items():
        for name, _, needs in members:
            assert first_group.get(name, "") == group, name
            cls = ANALYSES[name]
            assert ("opt-in" in needs) == (not getattr(cls, "default", True)), name
            targets = set(getattr(cls, "required_targets", ()) or ())
            assert ("labels" in needs) == ("label" in targets), name
            assert ("masks" in needs) == ("masks" in targets), name
    text = _help("analyze")
    for name in ANALYSES:
        assert f"  {name} " in text
    assert "masking group:" in text and "opt-in" in text


def test_flags_read_as_flags_and_required_options_say_so():
    for command in ("analyze", "compare", "probe"):
        text = _help(command)
        assert "<bool>" not in text, command
        for flag in ("--strict / --no-strict", "--resume / --no-resume", "--config", "--limit"):  # every command
            assert flag in text, (command, flag)
        assert "Required" in text or "[required]" in text, command
    assert "--version" in _help()


def test_params_of_names_an_unknown_analysis_in_one_line() -> None:
    from typer.testing import CliRunner

    from vitscope.cli.main import app

    out = CliRunner().invoke(app, ["analyze", "--params-of", "knn_prob"])
    assert out.exit_code == 2 and "Did you mean 'knn_probe'" in out.output and "Traceback" not in out.output
