"""Numbers for the report: an analysis's results.json summary turned into small tables.

Scalars go to a "settings and scores" table, per-block lists (one value per block) to a per-block table,
and per-block-per-head lists (``[L][H]``) to block x head tables; bulky arrays (maps) are left to the CSV
files and figures.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from vitscope.report.model import Table
from vitscope.viz.labels import display_name, label

__all__ = ["format_cell", "rows_table", "summary_tables"]

_MAX_HEADS = 16
_MAX_HEAD_TABLES = 6


def format_cell(value: Any) -> str:
    """Numbers with 4 significant digits, everything else as text (the template escapes it)."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return f"{float(value):.4g}"
    if isinstance(value, (list, tuple)) and len(value) <= 8:
        return ", ".join(format_cell(v) for v in value)
    return str(value)


def _is_numbers(x: Any) -> bool:
    return isinstance(x, list) and bool(x) and all(isinstance(v, numbers.Real) for v in x)


def _block_by_block(key: str, name: str, columns: int, n_blocks: int) -> bool:
    """Whether a square per-block matrix compares blocks with blocks (CKA) rather than blocks with heads: the
    shape alone cannot tell when a model has as many heads as blocks (ViT-B: 12 and 12)."""
    return columns == n_blocks and ("cka" in key.lower() or "cka" in name.lower())


def summary_tables(name: str, summary: Mapping[str, Any]) -> list[Table]:
    """Tables of one analysis's summary (see the module docstring)."""
    blocks = summary.get("blocks")
    n_blocks = len(blocks) if isinstance(blocks, list) else None
    scalars: list[list[Any]] = []
    per_block: dict[str, list[float]] = {}
    per_head: dict[str, list[list[float]]] = {}
    for key, value in summary.items():
        if key == "blocks":
            continue
        if value is None or isinstance(value, (str, numbers.Real)):
            scalars.append([key, format_cell(value)])
        elif isinstance(value, dict) and all(isinstance(v, (str, numbers.Real)) for v in value.values()) \
                and len(value) <= 8:
            scalars.append([key, ", ".join(f"{k}={format_cell(v)}" for k, v in value.items())])
        elif _is_numbers(value) and (n_blocks is None or len(value) == n_blocks) and len(value) <= 64:
            if n_blocks is not None:
                per_block[key] = value
            else:
                scalars.append([key, format_cell(value) if len(value) <= 8 else f"{len(value)} values"])
        elif (isinstance(value, list) and n_blocks is not None and len(value) == n_blocks
              and all(_is_numbers(row) and len(row) == len(value[0]) <= _MAX_HEADS for row in value)
              and len(per_head) < _MAX_HEAD_TABLES):
            per_head[key] = value
    tables: list[Table] = []
    if per_block:
        cols = list(per_block)
        rows = [[blocks[i], *(format_cell(per_block[c][i]) for c in cols)] for i in range(n_blocks)]
        tables.append(Table(f"{display_name(name)}: per block", ["block", *(label(c) for c in cols)], rows))
    for key, matrix in per_head.items():
        columns = len(matrix[0])
        rows = [[blocks[i], *(format_cell(v) for v in matrix[i])] for i in range(n_blocks)]
        title = f"{display_name(name)}: {label(key)}"  # matrices fold: their heat maps show them
        if _block_by_block(key, name, columns, n_blocks):
            tables.append(Table(f"{title} (block x block)", ["block", *(f"block {b}" for b in blocks)], rows,
                                folded=True))
        else:
            tables.append(Table(f"{title} (block x head)", ["block", *(f"head {h}" for h in range(columns))], rows,
                                folded=True))
    if scalars:  # keys as results.json spells them: a reader finds them there
        tables.append(Table(f"{display_name(name)}: settings and scores", ["key", "value"], scalars))
    return tables


def rows_table(title: str, records: Sequence[Mapping[str, Any]], note: str = "") -> Table:
    """A table from a list of dicts with the same keys (e.g. a best-block table)."""
    columns = list(records[0]) if records else []
    return Table(title, [label(c) for c in columns], [[format_cell(r.get(c)) for c in columns] for r in records],
                 note)
