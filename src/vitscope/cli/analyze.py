"""``vitscope analyze``: the resolved options handed to :func:`vitscope.workflows.analyze.analyze`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["analyze", "parse_analyses"]


def parse_analyses(names: str | None, spec, targets: frozenset[str] | None = None,
                   params: dict[str, dict[str, Any]] | None = None) -> list:
    """Comma-separated analysis or group names -> configured instances
    (:func:`vitscope.workflows.analyze.choose_analyses`)."""
    from vitscope.workflows.analyze import choose_analyses

    return choose_analyses(names, spec, frozenset(targets or ()), params)


def analyze(options: Mapping[str, Any], progress: bool | None = None,
            log: Callable[[str], None] | None = None) -> Path | None:
    """``vitscope analyze``: :func:`vitscope.workflows.analyze.analyze` with the resolved options.

    Returns:
        The path of results.json (None on the ranks other than 0 of a ``torchrun`` launch: rank 0 writes).
    """
    from vitscope.cli.launch import role
    from vitscope.workflows.analyze import analyze as analyze_data

    out = Path(options["out"])
    with role(log, progress) as me:  # under torchrun: this process's share; rank 0 writes and speaks
        analyze_data(options["model"], options["data"], options.get("analyses"), out=out,
                     params=options.get("params"), batch_size=options["batch_size"], device=options.get("device"),
                     dtype=options.get("dtype"), limit=options.get("limit"), strict=bool(options.get("strict")),
                     resume=options.get("resume", True),
                     checkpoint_seconds=float(options.get("checkpoint_seconds", 60.0)), progress=me.progress,
                     log=me.log, config=options, distributed=me.distributed,
                     figure_files=bool(options.get("figure_files")), image_size=options.get("image_size"))
    return out / "results.json" if me.main else None
