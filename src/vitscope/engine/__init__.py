"""The engine: the one loop over images and what it returns (:class:`Results`), resumable state
(:class:`Checkpoint`), feature extraction into the cache and tiled runs. The loop itself is ``vitscope.run``
(``vitscope.engine.run`` is the module that defines it). Names are imported on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vitscope._lazy import lazy_exports

__all__ = ["Checkpoint", "EmptyRunError", "Results", "extract_features", "run_tiled"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "Checkpoint": "vitscope.engine.state",
    "EmptyRunError": "vitscope.engine.results",
    "Results": "vitscope.engine.results",
    "extract_features": "vitscope.engine.extract",
    "run_tiled": "vitscope.engine.tiling",
})

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from vitscope.engine.extract import extract_features
    from vitscope.engine.results import EmptyRunError, Results
    from vitscope.engine.state import Checkpoint
    from vitscope.engine.tiling import run_tiled
