"""Analyses registered by a test, and the modules it imported for them, do not outlive it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def kept_registry(folder: Path) -> Iterator[None]:
    """Restore the registry's tables, ``sys.path`` and the files ``--import`` imported, and forget the modules
    imported from ``folder``, on the way out."""
    from vitscope.analyses import plugins, registry

    analyses, groups = dict(registry.ANALYSES), dict(registry.GROUPS)  # reading them loads the built-ins first
    files, path = dict(plugins._FILES), list(sys.path)
    try:
        yield
    finally:
        for live, saved in ((registry._ANALYSES, analyses), (registry._GROUPS, groups), (plugins._FILES, files)):
            live.clear()
            live.update(saved)
        sys.path[:] = path
        inside = str(Path(folder).resolve())
        for name, module in list(sys.modules.items()):
            where = getattr(module, "__file__", None) or ""
            if where and str(Path(where).resolve()).startswith(inside):
                del sys.modules[name]
