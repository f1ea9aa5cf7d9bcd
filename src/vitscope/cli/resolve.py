"""Options of a command resolved from ``--config`` and the command line (:mod:`vitscope.workflows.options`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer

from vitscope.cli.errors import PASS_BATCH

__all__ = ["resolve_or_exit"]


def resolve_or_exit(table: tuple, given: Mapping[str, Any], config: Path | None) -> dict[str, Any]:
    """Merge ``--config`` and the command line; a bad or missing option is bad usage: one line, exit status 2."""
    from vitscope.workflows.options import ConfigError, resolve_options

    try:
        options = resolve_options(table, given, config)
    except ConfigError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    if options.get("batch_size") is not None:  # a pass whose numbers do not depend on it
        PASS_BATCH.set(int(options["batch_size"]))
    return options
