"""``vitscope compare``: parsing lives in :mod:`vitscope.cli.main`; the work in :mod:`vitscope.workflows.compare`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["compare"]


def compare(options: Mapping[str, Any], progress: bool | None = None,
            log: Callable[[str], None] | None = None) -> Path | None:
    """:func:`vitscope.workflows.compare.compare` with the resolved options; results.json's path (None on ranks
    other than 0 under ``torchrun``)."""
    from vitscope.cli.launch import role
    from vitscope.workflows.compare import compare as compare_data

    with role(log, progress) as me:
        path = compare_data(options, me.progress, me.log, distributed=me.distributed)
    return path if me.main else None
