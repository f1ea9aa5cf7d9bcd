"""The data of a paired-similarity explorer: a small gallery, each query's top hits per model and map kind,
and both maps of every (query, hit) pair as tiny PNGs the browser enlarges over the thumbnails.

Maps are coloured on the diverging map of :mod:`vitscope.viz.explain_figures` around their even share (the map's
mean; red: a patch adds more than an even share, blue: less), each on its own scale, at the token-grid
resolution (a few hundred bytes each).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from vitscope.report.explorer import colour_palette, css_gradient, jpeg_bytes, palette_png
from vitscope.report.model import PairExplorer

__all__ = ["PairHits", "pair_explorer"]

#: (hit index into the gallery, cosine, map over the query [h, w], map over the hit [h, w]) per hit of a query
PairHits = list[tuple[int, float, np.ndarray, np.ndarray]]


def _data_url(kind: str, data: bytes) -> str:
    return f"data:image/{kind};base64," + base64.b64encode(data).decode("ascii")


#: opacity of each level of a signed map over its photo: clear at the even share (level 127.5), 80 % at the
#: ends, as :func:`vitscope.viz.explain_figures.signed_overlay` blends the figure files
SIGNED_ALPHA = np.round(np.abs(np.arange(256) - 127.5) / 127.5 * 0.8 * 255).astype(np.uint8)


def _signed_png(m: np.ndarray) -> str:
    # matplotlib only when a page has such an explorer
    from vitscope.viz.explain_figures import SIGNED_CMAP, even_share_scale

    m = np.nan_to_num(np.asarray(m, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    if m.size == 0:
        m = np.zeros((1, 1))
    centre, limit = even_share_scale(m)
    levels = np.clip(((m - centre) / limit * 0.5 + 0.5) * 255.999, 0, 255).astype(np.uint8)
    return _data_url("png", palette_png(levels, colour_palette(SIGNED_CMAP), SIGNED_ALPHA))


def pair_explorer(title: str, images: Sequence[np.ndarray], names: Sequence[str], classes: Sequence[str],
                  hits: Mapping[str, Mapping[str, Sequence[PairHits]]], queries: Sequence[int], caption: str = "",
                  paper: str = "paper 000, fig. 9") -> PairExplorer:
    """A :class:`~vitscope.report.model.PairExplorer`.

    Args:
        title: the heading above it.
        images: ``[H, W, 3]`` uint8 gallery thumbnails (as the models saw them).
        names, classes: file name and class name of every gallery image.
        hits: ``{model: {map kind: [per query: its hits]}}`` (kinds e.g. ``"R gamma (published)"``,
            ``"R^T gamma"``; a CNN has one); ``queries[i]`` is the gallery index of query ``i``.
        caption, paper: text under it.
    """
    from vitscope.viz.explain_figures import SIGNED_CMAP

    results: dict[str, dict[str, list[list[dict[str, Any]]]]] = {}
    for model, kinds in hits.items():
        results[model] = {}
        for kind, per_query in kinds.items():
            results[model][kind] = [[{"j": int(j), "score": round(float(s), 4) if np.isfinite(s) else None,
                                      "map_q": _signed_png(mq),
                                      "map_j": _signed_png(mj)} for j, s, mq, mj in q_hits] for q_hits in per_query]
    data = {"images": [_data_url("jpeg", jpeg_bytes(np.asarray(im))) for im in images],
            "names": [str(n) for n in names], "classes": [str(c) for c in classes],
            "queries": [int(q) for q in queries], "models": list(results),
            "kinds": list(dict.fromkeys(k for kinds in results.values() for k in kinds)), "results": results,
            "bar": css_gradient(SIGNED_CMAP)}
    return PairExplorer(title, data, caption, paper)
