"""Numbers for the report: an analysis's results.json summary turned into small tables.

Scalars go to a "settings and scores" table, per-block lists (one value per block) to a per-block table,
per-block-per-head lists (``[L][H]``) to block x head tables, lists of rows given as dicts (an experiment's
scores, each beside its controls) to a table each, and lists as long as a ``rows`` list of names to a table by
those names; bulky arrays (maps) are left to the CSV files and figures.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from vitscope.report.model import Table
from vitscope.viz.labels import display_name, label

__all__ = ["format_cell", "rows_table", "summary_tables"]

_MAX_HEADS = 16
_MAX_HEAD_TABLES = 6
_MAX_RECORDS = 500  # longer row lists are left to the CSV files


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


def _records(x: Any) -> bool:
    """A list of rows given as dicts of scalars (an experiment's score table)."""
    return isinstance(x, list) and 0 < len(x) <= _MAX_RECORDS and all(
        isinstance(r, Mapping) and all(v is None or isinstance(v, (str, numbers.Real)) for v in r.values()) for r in x)


def _labels(x: Any) -> bool:
    return isinstance(x, list) and bool(x) and all(isinstance(v, str) for v in x)


def summary_tables(name: str, summary: Mapping[str, Any], columns_of: Callable[[str], str | None] | None = None
                   ) -> list[Table]:
    """Tables of one analysis's summary (see the module docstring).

    Args:
        name: the analysis.
        summary: its results.json summary.
        columns_of: what the columns of a per-block matrix are (``"rank"``, ``"channel"``), by key, where the result
            declares it (:meth:`~vitscope.analyses.result.Result.dims`); None or unknown: heads.
    """
    blocks = summary.get("blocks")
    n_blocks = len(blocks) if isinstance(blocks, list) else None
    # named rows (e.g. "embedding", "block 0", ...) with lists of as many numbers: a table of their own
    row_names = summary.get("rows") if _labels(summary.get("rows")) else None
    scalars: list[list[Any]] = []
    per_block: dict[str, list[float]] = {}
    per_head: dict[str, list[list[float]]] = {}
    per_row: dict[str, list[float]] = {}
    records: dict[str, list[Mapping[str, Any]]] = {}
    for key, value in summary.items():
        if key == "blocks" or (row_names is not None and key == "rows"):
            continue
        if _records(value):
            records[key] = value
            continue
        if row_names is not None and _is_numbers(value) and len(value) == len(row_names) != n_blocks:
            per_row[key] = value
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
    tables: list[Table] = [rows_table(f"{display_name(name)}: {label(key)}", rows) for key, rows in records.items()]
    if per_row:
        cols = list(per_row)
        rows = [[row_names[i], *(format_cell(per_row[c][i]) for c in cols)] for i in range(len(row_names))]
        tables.append(Table(f"{display_name(name)}: per row", ["row", *(label(c) for c in cols)], rows))
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
            what = (columns_of(key) if columns_of is not None else None) or "head"
            tables.append(Table(f"{title} (block x {what})", ["block", *(f"{what} {h}" for h in range(columns))], rows,
                                folded=True))
    if scalars:  # keys as results.json spells them: a reader finds them there
        tables.append(Table(f"{display_name(name)}: settings and scores", ["key", "value"], scalars))
    return tables


def rows_table(title: str, records: Sequence[Mapping[str, Any]], note: str = "") -> Table:
    """A table from a list of dicts (e.g. a best-block table): a column for every key, in order of appearance."""
    columns = list(dict.fromkeys(k for r in records for k in r))
    return Table(title, [label(c) for c in columns], [[format_cell(r.get(c)) for c in columns] for r in records],
                 note)
