"""What this process does when ``torchrun`` started several: its share of the pass; rank 0 also writes and speaks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["Role", "role"]


@dataclass(frozen=True)
class Role:
    """``distributed``: one of several processes; ``main``: writes outputs, logs and shows progress."""

    distributed: bool
    main: bool
    log: Callable[[str], None] | None
    progress: bool | None


@contextmanager
def role(log: Callable[[str], None] | None, progress: bool | None = None) -> Iterator[Role]:
    """This process's role for one command; a process group joined meanwhile is left at the end."""
    from vitscope.engine.distributed import in_torchrun, is_main_process, leave

    distributed = in_torchrun()
    main = not distributed or is_main_process()
    try:
        yield Role(distributed, main, log if main else None, progress if main else False)
    finally:
        if distributed:
            leave()
