"""Numbers read back from results.json as the command line prints them.

results.json writes a value that is not a number (NaN, an infinity) as null (:mod:`vitscope.strict_json`);
printed, it reads ``n/a`` instead of failing to format.
"""

from __future__ import annotations

from typing import Any

__all__ = ["counted", "shown"]


def shown(value: Any, spec: str = ".4f") -> str:
    """``value`` formatted with ``spec``; ``"n/a"`` for None (a null of results.json)."""
    return "n/a" if value is None else format(value, spec)


def counted(n: int, one: str, many: str | None = None) -> str:
    """``n`` and the noun in its number: ``1 analysis``, ``2 analyses`` (``many`` defaults to ``one`` + s)."""
    return f"{n} {one if n == 1 else (many or one + 's')}"
