"""Explain one pair of image files and write everything into a folder (``vitscope explain-pair``).

Through the one writer: ``results.json`` (score, map sums, options), the raw maps (``arrays/paired_similarity.npz``,
or one CSV grid per map in ``tables/`` with ``--format csv``), one overlay per image (``figures/a_given_b.png``,
``figures/b_given_a.png``), ``figures/pair.png`` with both images, both maps and, for transformers, the
output-agnostic rollout maps beside them (paper 000 figure 8), and report.html.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitscope.analyses.result import Figure, SummaryResult, png_path
from vitscope.errors import VitscopeUsageError
from vitscope.outputs.folder import check_output
from vitscope.outputs.lock import releasing_outputs

__all__ = ["default_pooling", "default_projection", "explained_embedding", "write_pair_report"]


def default_projection(name: str, backbone: Any) -> str | None:
    """``"head"`` for a model whose head projects its embedding (``ModelSpec.head_output``: the zoo's metric models,
    also reloaded from a checkpoint), else None."""
    return "head" if backbone.spec.head_output == "embedding" else None


def default_pooling(backbone: Any) -> str:
    """The pooling an explanation of ``backbone``'s embedding uses unless told (``explain-pair``'s ``auto``,
    ``attribute`` and ``explanations`` alike).

    The model's own where it says so (timm's and the tiny ViT's ``global_pool``: ``"token"`` the CLS token,
    ``"avg"`` the spatial mean); else, for a model without a head, its default embedding's
    (:func:`~vitscope.models.outputs.embedding_pooling`: the CLS token, else the spatial mean), which is what
    ``attribute`` and ``explanations`` explain; else (a classifier, which they score by a logit) the spatial
    mean, paper 000's pooling.
    """
    from vitscope.models.outputs import embedding_pooling

    pool = getattr(backbone.model, "global_pool", None)
    if pool == "token" and "cls" in backbone.spec.prefix_kinds:
        return "cls"
    if pool == "avg" or backbone.spec.has_head:
        return "mean"
    return embedding_pooling(backbone.spec)


def explained_embedding(name: str, backbone: Any) -> tuple[str, Any] | None:
    """What an attribution of ``name``'s output explains: None for a classifier (the logit of a class); else the
    ``(pooling, projection)`` of the embedding whose cosine it explains.

    Both pool by :func:`default_pooling`, as ``explain-pair`` does: a metric-learning net
    (:func:`default_projection`) then projects through its linear head (its head is no classifier); a model
    without a head is unprojected.
    """
    if default_projection(name, backbone) == "head":
        from vitscope.explain.paired import _head_linear

        return default_pooling(backbone), _head_linear(backbone)
    if backbone.spec.has_head:
        return None
    return default_pooling(backbone), None


@releasing_outputs
def write_pair_report(model: str, path_a: str | os.PathLike, path_b: str | os.PathLike, out: str | os.PathLike,
                      projection: str = "auto", pooling: str = "auto", rollout: bool = True, transpose: bool = False,
                      fmt: str = "npy", image_size: int | None = None, keep_aspect: bool = False) -> dict[str, Any]:
    """Explain the similarity of two image files with ``model`` (at ``image_size`` when given, else its own
    preprocessing's size; with ``keep_aspect`` each image at its own aspect ratio and token grid) and write the
    report into ``out``.

    Returns:
        The ``results.json`` document.
    """
    check_output(out)  # before any work: a wrong --out costs nothing
    import pandas as pd

    from vitscope.data.images import load_rgb
    from vitscope.engine.provenance import model_identity
    from vitscope.explain.paired import PairedSimilarity
    from vitscope.models.load import load_model
    from vitscope.models.preprocess import resize_crop
    from vitscope.outputs import RunResult, prepare_output, write_run
    from vitscope.viz.explain_figures import even_share_scale, pair_figure, signed_map_picture

    if fmt not in ("npy", "csv"):
        raise VitscopeUsageError(f"--format must be npy or csv, got '{fmt}'")
    if projection not in ("auto", "head", "none"):
        raise VitscopeUsageError(f"--projection must be auto, head or none, got '{projection}'")
    backbone = load_model(model, image_size=image_size, keep_aspect=keep_aspect)
    proj = default_projection(model, backbone) if projection == "auto" else (None if projection == "none" else "head")
    pool = default_pooling(backbone) if pooling == "auto" else pooling
    ps = PairedSimilarity(backbone, pooling=pool, projection=proj, rollout=rollout, transpose=transpose)
    pil = [load_rgb(p) for p in (path_a, path_b)]
    shown = [np.asarray(resize_crop(im, backbone.spec), dtype=np.uint8) for im in pil]  # what the model sees
    res = ps.explain([pil[0]], [pil[1]])
    out = prepare_output(out)  # once the pair is explained: a refused model, image or option leaves no folder
    maps = {name: getattr(res, name)[0].detach().cpu().double() for name in
            ("map_a", "map_b", "raw_a", "raw_b", "rollout_a", "rollout_b") if getattr(res, name) is not None}
    rollouts = [None if r is None else r[0] for r in (res.rollout_a, res.rollout_b)]

    names = (Path(path_a).name, Path(path_b).name)

    def overlay_figure(img: np.ndarray, m: torch.Tensor, title: str):
        def draw(path: Path) -> list[Path]:  # one image and its map around its even share
            return signed_map_picture(img, m, even_share_scale(m), title, path)
        return draw

    def pair(path: Path) -> list[Path]:
        pair_figure(shown[0], shown[1], res.map_a[0], res.map_b[0], float(res.score[0]), png_path(path),
                    *rollouts, names=names)
        return [png_path(path)]

    paper = "paper 000, fig. 4 and 8"
    figures = [Figure("pair", pair, "The pair and its maps", "Both images, their similarity maps and, for "
                      "transformers, the output-agnostic rollout maps beside them.", paper),
               Figure("a_given_b", overlay_figure(shown[0], res.map_a[0], f"{names[0]} given {names[1]}"),
                      f"{names[0]} given {names[1]}", f"Which patches of {names[0]} make it similar to {names[1]} "
                      "(red: more than an even share of the map; blue: less).", paper),
               Figure("b_given_a", overlay_figure(shown[1], res.map_b[0], f"{names[1]} given {names[0]}"),
                      f"{names[1]} given {names[0]}", f"Which patches of {names[1]} make it similar to {names[0]} "
                      "(red: more than an even share of the map; blue: less).", paper)]
    summary = {
        "score": float(res.score[0]), "grid": list(res.map_a.shape[-2:]), "grid_b": list(res.map_b.shape[-2:]),
        "raw_sum_a": float(res.raw_a[0].sum()), "raw_sum_b": float(res.raw_b[0].sum()),
        "map_sum_a": float(res.map_a[0].sum()), "map_sum_b": float(res.map_b[0].sum()),
        "residual_a": float(res.residual_a[0]), "residual_b": float(res.residual_b[0]),
        "redistribution": None if not ps.use_rollout else ("R^T gamma" if transpose else "R gamma"),
    }
    tables = {f"paired_similarity_{k}": pd.DataFrame(v.numpy()) for k, v in maps.items()} if fmt == "csv" else {}
    result = PairResult("paired_similarity", summary, tables=tables, figures=figures,
                        tensors=maps if fmt == "npy" else {},
                        intro="Why the two images are similar to the model: the cosine similarity of their pooled "
                              "embeddings decomposed over each image's tokens and redistributed over its patches.")
    config = {"command": "explain-pair", "model": model, "projection": proj or "none", "pooling": pool,
              "rollout": ps.use_rollout, "transpose": transpose, "format": fmt, "image_size": image_size,
              "keep_aspect": keep_aspect}
    path = write_run(out, RunResult(
        "explain-pair", title=f"vitscope explain-pair: {model}", config=config, results={"paired_similarity": result},
        models=[model_identity(model, backbone)],
        data={"name": "image pair", "a": str(Path(path_a).resolve()), "b": str(Path(path_b).resolve())},
        num_images=2))
    return json.loads(path.read_text())


class PairResult(SummaryResult):
    """The explained pair: with ``--format npy`` its maps go to ``arrays/paired_similarity.npz`` whatever their
    size; with ``csv`` each map is a grid table."""

    def arrays(self) -> dict[str, torch.Tensor]:
        return dict(self.tensors)

    def to_frame(self, key: str | None = None):
        """One tensor as a frame (``key``); no long table (each map is its own grid table)."""
        if key is not None:
            return super().to_frame(key)
        import pandas as pd

        return pd.DataFrame()
