"""What a command prints of text it did not write (file names, model names, messages built from them): control
characters shown as escapes, so a name cannot clear the screen, retitle the window or forge a link."""

from __future__ import annotations

import unicodedata

import typer

__all__ = ["printable", "say"]


#: characters that change how a terminal shows what follows: right-to-left embeddings, overrides and isolates, and
#: the line and paragraph separators (control characters, Unicode's Cc, are found by their category)
_REORDERING = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029")


def printable(text: str) -> str:
    """``text`` with every control character (an escape sequence's ESC, BEL, DEL, C1) and every character that
    reorders or breaks the line written as its escape (``\\x1b``); other characters (accents, CJK, emoji and
    their joiners) as they are."""
    return "".join(c.encode("unicode_escape").decode("ascii") if unicodedata.category(c) == "Cc" or c in _REORDERING
                   else c for c in str(text))


def say(text: str) -> None:
    """One line of what a command is doing, on stderr (stdout holds its results)."""
    typer.echo(printable(text), err=True)
