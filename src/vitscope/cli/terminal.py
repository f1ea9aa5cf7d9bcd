"""What a command prints of text it did not write (file names, model names, messages built from them): control
characters shown as escapes, so a name cannot clear the screen, retitle the window or forge a link."""

from __future__ import annotations

import typer

__all__ = ["printable", "say"]


def printable(text: str) -> str:
    """``text`` with every character Python does not print (control characters, format characters such as a
    right-to-left override, separators other than the space) written as its escape (``\\x1b``)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(text))


def say(text: str) -> None:
    """One line of what a command is doing, on stderr (stdout holds its results)."""
    typer.echo(printable(text), err=True)
