"""``run_tiled``: ``vitscope.run`` on dense features by tiling (paper 002 appendix B.4).

The tiling itself is a backbone wrapper (:mod:`vitscope.models.tiled`), so every spatial-feature analysis
gets it without knowing; this entry point adds the one thing the wrapper cannot do on its own: name the
analysis that cannot run on tiled features (attention analyses, CLS readers) before any forward pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from typing import Any as Dataset  # anything vitscope.run reads (a Source, a folder...)

from vitscope.analyses.base import Analysis
from vitscope.analyses.registry import get_analysis
from vitscope.engine.results import Results
from vitscope.engine.run import run
from vitscope.models.backbone import Backbone
from vitscope.models.tiled import TiledBackbone, check_tiling, wrap_tiled

__all__ = ["run_tiled"]


def run_tiled(backbone: Backbone, dataset: Dataset | str, analyses: Sequence[Analysis | str], scale: float = 2.0,
              **run_options: Any) -> Results:
    """One pass of ``analyses`` over ``dataset`` on tiled dense features.

    Each image is preprocessed to a frame ``scale`` times the model input (short side; centre-cropped to a
    square of that side for square models), cut into model-input tiles, and the tiles' recorded tokens are
    stitched into a ``scale`` times denser grid (:class:`~vitscope.models.tiled.TiledBackbone`).

    Args:
        backbone: the model (untiled, or already wrapped by :func:`~vitscope.models.tiled.wrap_tiled`, in which
            case ``scale`` is ignored).
        dataset: as for :func:`vitscope.run`.
        analyses: analysis instances, or registered names (their default configuration), as for
            :func:`vitscope.run`; none may read attention or the CLS token.
        scale: frame side / model input side (the paper: 2).
        **run_options: passed to :func:`vitscope.run` (``batch_size``, ``device``, ``dtype``, ``limit``, ...).

    Returns:
        The :class:`~vitscope.engine.results.Results` of the pass.

    Raises:
        TilingError: an analysis reads attention or the CLS token (the message names it).
    """
    given = [analyses] if isinstance(analyses, str) else list(analyses)
    analyses = [get_analysis(a) if isinstance(a, str) else a for a in given]  # checked as vitscope.run takes them
    tiled = backbone if isinstance(backbone, TiledBackbone) else wrap_tiled(backbone, scale)
    check_tiling(analyses, tiled.inner.spec)
    results = run(tiled, dataset, analyses, **run_options)
    for analysis in (a for a, g in zip(analyses, given) if isinstance(g, str)):  # as run releases what it made
        analysis.release_rows()
    return results
