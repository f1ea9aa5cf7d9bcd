"""Plain text tables for the terminal: every cell whole (no cutting, no wrapping inside a cell)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

__all__ = ["plain_table"]


def plain_table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Collection[str] = ()) -> str:
    """Columns as wide as their widest cell, two spaces apart; ``right`` names the right-aligned columns.

    A long name widens its column rather than being cut, so a name can be copied from the table as it is.
    """
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(str(c).rjust(w) if h in right else str(c).ljust(w)
                         for h, c, w in zip(header, cells, widths)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)])
