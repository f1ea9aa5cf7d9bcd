"""``vitscope ... --help`` suffices: flags read as flags, required options say so, and ``analyze --help`` lists
every analysis with its group, what it needs and whether it runs by default (from the registry's metadata)."""

from __future__ import annotations

from typer.testing import CliRunner

from vitscope.analyses import ANALYSES, GROUPS
from vitscope.cli.main import app


def _help(*command: str) -> str:
    result = CliRunner().invoke(app, [*command, "--help"], terminal_width=120)
    assert result.exit_code == 0
    return result.output


def listed_by_group(text: str) -> dict[str, dict[str, str]]:
    """``analyze --help``'s list of analyses: group ("" for none) -> analysis -> the rest of its line."""
    found: dict[str, dict[str, str]] = {}
    group = None
    for line in text.splitlines():
        heading = line.strip()
        if heading.endswith(" group:"):
            group = "" if heading == "not in a group:" else heading.removesuffix(" group:")
            found[group] = {}
        elif group is not None and line.startswith("    ") and line.strip():
            name, _, rest = line.strip().partition(" ")
            found[group][name] = rest.strip()
        elif not line.strip():
            group = None
    return found


def test_the_help_lists_every_registered_analysis_under_its_group():
    listed = listed_by_group(_help("analyze"))
    names = [name for members in listed.values() for name in members]
    assert sorted(names) == sorted(ANALYSES) and len(set(names)) == len(names)
    first_group = {}
    for group, members in GROUPS.items():
        for name in members:
            first_group.setdefault(name, group)
    for group, members in listed.items():
        assert list(members) == [n for n in ANALYSES if first_group.get(n, "") == group]  # the registry's order
        for name, line in members.items():
            cls = ANALYSES[name]
            assert line.startswith(cls.summary), name
            assert ("opt-in" in line) == (not cls.default), name
            targets = set(cls.required_targets)
            assert ("labels" in line) == ("label" in targets), name
            assert ("masks" in line) == ("masks" in targets), name
            assert ("a classifier head" in line) == getattr(cls, "needs_head", False), name
    assert "masking" in listed and "opt-in" in listed["masking"]["foreground_masking"]


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


def test_every_command_takes_import():
    import typer

    def leaves(command) -> list:
        subcommands = getattr(command, "commands", None)
        return [leaf for sub in subcommands.values() for leaf in leaves(sub)] if subcommands else [command]

    commands = leaves(typer.main.get_command(app))
    assert len(commands) >= 12 and {"analyze", "analyses", "list", "guided-mae"} <= {c.name for c in commands}
    for command in commands:
        assert any("--import" in p.opts for p in command.params), command.name
    assert "--import MODULE" in _help("probe")


def test_the_list_of_analyses_is_read_without_torch():
    """``analyze --help`` lists the built-ins from their source: torch (seconds to import) stays out."""
    import subprocess
    import sys

    probe = ("import sys\nfrom vitscope.cli.main import app\ntry:\n"
             "    app(['analyze', '--help'], prog_name='vitscope')\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("[]"), proc.stdout + proc.stderr
    assert "  cls_attention_maps " in proc.stdout and "[needs a classifier head, labels; opt-in]" in proc.stdout
