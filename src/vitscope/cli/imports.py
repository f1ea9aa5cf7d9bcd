"""``--import MODULE`` on every command: modules of analyses (``@vitscope.register_analysis``) imported before the
command reads its options, so that ``--analyses``, ``--params-of`` and ``--help`` know their analyses.

Every command of a :class:`CommandLine` app gets the option: its commands are :class:`ImportingCommand`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from vitscope.cli.parser import OneLineGroup
from vitscope.cli.terminal import say

__all__ = ["IMPORT_HELP", "CommandLine", "ImportingCommand", "import_or_exit"]

IMPORT_HELP = ("Module that registers analyses (@vitscope.register_analysis): a dotted name (my_lab.token_norm) or a "
               ".py file; repeatable. Imported before the other options are read.")


def import_or_exit(names: Sequence[str]) -> None:
    """Import each module of analyses; one that cannot be imported is one ``error:`` line and exit status 1."""
    from vitscope.analyses.plugins import PluginImportError, import_analyses

    for name in names:
        try:
            import_analyses(name)
        except PluginImportError as err:
            say(f"error: {err}")
            raise typer.Exit(1) from None


@functools.cache
def _import_option() -> Any:
    """The ``--import`` option as typer builds it (one object, shared by every command; its value is not passed
    to the command's function: :meth:`ImportingCommand.parse_args` has used it)."""
    probe = typer.Typer()

    @probe.command()
    def _probe(imports: list[str] | None = typer.Option(None, "--import", metavar="MODULE", help=IMPORT_HELP)) -> None:
        pass  # pragma: no cover - never run

    option = typer.main.get_command(probe).params[0]
    option.expose_value = False
    return option


class ImportingCommand(TyperCommand):
    """A command with ``--import``, and an epilog that may be a function (help that lists what was imported)."""

    def __init__(self, *args: Any, params: list | None = None, **kwargs: Any) -> None:
        super().__init__(*args, params=[*(params or []), _import_option()], **kwargs)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        """Import the ``--import`` modules first, wherever they stand (before ``--help`` or ``--params-of``)."""
        if not ctx.resilient_parsing:
            opts, _, _ = self.make_parser(ctx).parse_args(args=list(args))
            import_or_exit(opts.get(_import_option().name) or ())
        return super().parse_args(ctx, args)

    def format_epilog(self, ctx: Any, formatter: Any) -> None:
        epilog: str | Callable[[], str] | None = self.epilog
        text = epilog() if callable(epilog) else epilog
        if text:
            formatter.write_paragraph()
            with formatter.indentation():
                formatter.write_text(inspect.cleandoc(text))


class CommandLine(typer.Typer):
    """A typer app whose commands are :class:`ImportingCommand` (``--import`` everywhere) and whose parser errors
    are one line (:class:`~vitscope.cli.parser.OneLineGroup`)."""

    def __init__(self, *args: Any, cls: type[TyperGroup] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, cls=cls or OneLineGroup, **kwargs)

    def command(self, *args: Any, cls: type[TyperCommand] | None = None, **kwargs: Any) -> Callable:
        return super().command(*args, cls=cls or ImportingCommand, **kwargs)
