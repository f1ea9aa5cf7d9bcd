"""``vitscope analyses``: every analysis, built-in and plug-in, with its groups and what it needs."""

from __future__ import annotations

import typer

from vitscope.cli.errors import one_line_errors
from vitscope.strict_json import dumps

__all__ = ["analyses"]


@one_line_errors
def analyses(as_json: bool = typer.Option(False, "--json", help="Print JSON (every field, the description too) "
                                          "instead of a table.")) -> None:
    """List every analysis: built-in, from --import and from installed packages (vitscope.analyses entry points),
    with its groups, what it needs of the model and the data, and whether analyze runs it by default."""
    from vitscope.analyses.catalog import analysis_catalog

    infos = analysis_catalog()
    if as_json:
        typer.echo(dumps([info.to_json() for info in infos], indent=1))
        return
    from vitscope.cli.columns import plain_table

    columns = ("name", "groups", "runs", "needs", "from", "summary")
    rows = [[info.name, ",".join(info.groups) or "-", "default" if info.default else "opt-in",
             ", ".join(info.needs()) or "-", info.module if info.plugin else "vitscope", info.summary]
            for info in infos]
    typer.echo(plain_table(columns, rows))
    typer.echo("Parameters of one: vitscope analyze --params-of NAME. More: --import MODULE, or a package's "
               "vitscope.analyses entry point (docs/extending.md).")
