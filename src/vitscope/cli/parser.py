"""The command line parser's own errors (an unknown option, a value out of range, a missing option) as the rest of
vitscope's errors: one ``error: ...`` line on stderr and exit status 2, instead of click's usage block.

Every group of a :class:`~vitscope.cli.imports.CommandLine` app is a :class:`OneLineGroup`; the root group sees
the parser errors of every command below it (they are raised while it invokes them).
"""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

__all__ = ["OneLineGroup", "OneLineUsageError"]

# click's exceptions, found through typer's: recent typer releases carry their own copy of click
UsageError: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
_NO_ARGS_IS_HELP: tuple[type, ...] = tuple(
    c for c in (getattr(sys.modules[UsageError.__module__], "NoArgsIsHelpError", None),) if c is not None)


class OneLineUsageError(UsageError):  # type: ignore[misc,valid-type]
    """A usage error shown as one line, with the help to read named in it."""

    def show(self, file: Any = None) -> None:
        hint = f" (see '{self.ctx.command_path} --help')" if self.ctx is not None else ""
        message = " ".join(self.format_message().split()).rstrip(".")  # click's messages may span lines
        typer.echo(f"error: {message}{hint}", err=True, file=file)


def _one_line(err: Any) -> NoReturn:
    if isinstance(err, (OneLineUsageError, *_NO_ARGS_IS_HELP)):
        raise err  # already one line, or the help a bare group prints
    raise OneLineUsageError(err.format_message(), err.ctx) from None


class OneLineGroup(TyperGroup):
    """A typer group whose parser errors, and those of the commands it runs, are one line (exit status 2)."""

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None,
                     **extra: Any) -> Any:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except UsageError as err:
            _one_line(err)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except UsageError as err:
            _one_line(err)
