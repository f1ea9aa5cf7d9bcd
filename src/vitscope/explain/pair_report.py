"""Explain one pair of image files and write everything into a folder (``vitscope explain-pair``).

Writes ``results.json`` (score, map sums, options, files), the raw maps (``.npy`` or ``.csv``), one
overlay per image (``a_given_b.png``, ``b_given_a.png``) and ``pair.png`` with both images, both maps and,
for transformers, the output-agnostic rollout maps beside them (paper 000 figure 8).
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

__all__ = ["default_pooling", "default_projection", "write_pair_report"]


def default_projection(name: str, backbone: Any) -> str | None:
    """``"head"`` for the zoo's metric models (their head is the embedding projection), else None."""
    from vitscope.zoo.catalog import get_entry

    try:
        return "head" if get_entry(name.split("@")[0]).recipe == "metric" else None
    except KeyError:
        return None


def default_pooling(backbone: Any) -> str:
    """The pooling the model itself uses where it says so (timm's ``global_pool``), else ``"mean"``."""
    pool = getattr(backbone.model, "global_pool", None)
    return "cls" if pool == "token" and "cls" in backbone.spec.prefix_kinds else "mean"


def _write_array(out: Path, name: str, arr: torch.Tensor, fmt: str) -> str:
    data = arr.detach().cpu().double().numpy()
    if fmt == "npy":
        np.save(out / f"{name}.npy", data)
        return f"{name}.npy"
    np.savetxt(out / f"{name}.csv", data, delimiter=",", fmt="%.8g")
    return f"{name}.csv"


def write_pair_report(model: str, path_a: str | os.PathLike, path_b: str | os.PathLike, out: str | os.PathLike,
                      projection: str = "auto", pooling: str = "auto", rollout: bool = True, transpose: bool = False,
                      fmt: str = "npy") -> dict[str, Any]:
    """Explain the similarity of two image files with ``model`` and write the report into ``out``.

    Returns:
        The ``results.json`` document.
    """
    import vitscope
    from vitscope.data.images import load_rgb
    from vitscope.explain.paired import PairedSimilarity
    from vitscope.models.load import load_model
    from vitscope.models.preprocess import resize_crop
    from vitscope.viz.explain_figures import overlay, pair_figure

    if fmt not in ("npy", "csv"):
        raise ValueError(f"--format must be npy or csv, got '{fmt}'")
    if projection not in ("auto", "head", "none"):
        raise ValueError(f"--projection must be auto, head or none, got '{projection}'")
    backbone = load_model(model)
    proj = default_projection(model, backbone) if projection == "auto" else (None if projection == "none" else "head")
    pool = default_pooling(backbone) if pooling == "auto" else pooling
    ps = PairedSimilarity(backbone, pooling=pool, projection=proj, rollout=rollout, transpose=transpose)
    pil = [load_rgb(p) for p in (path_a, path_b)]
    shown = [np.asarray(resize_crop(im, backbone.spec), dtype=np.uint8) for im in pil]  # what the model sees
    res = ps.explain([pil[0]], [pil[1]])
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    files = {}
    for name in ("map_a", "map_b", "raw_a", "raw_b", "rollout_a", "rollout_b"):
        value = getattr(res, name)
        if value is not None:
            files[name] = _write_array(outdir, name, value[0], fmt)
    for name, img, m in (("a_given_b", shown[0], res.map_a[0]), ("b_given_a", shown[1], res.map_b[0])):
        Image.fromarray(overlay(img, m)).save(outdir / f"{name}.png")
        files[name] = f"{name}.png"
    rollouts = [None if r is None else r[0] for r in (res.rollout_a, res.rollout_b)]
    pair_figure(shown[0], shown[1], res.map_a[0], res.map_b[0], float(res.score[0]), outdir / "pair.png", *rollouts)
    files["pair"] = "pair.png"
    summary = {
        "score": float(res.score[0]), "grid": list(res.map_a.shape[-2:]),
        "raw_sum_a": float(res.raw_a[0].sum()), "raw_sum_b": float(res.raw_b[0].sum()),
        "map_sum_a": float(res.map_a[0].sum()), "map_sum_b": float(res.map_b[0].sum()),
        "residual_a": float(res.residual_a[0]), "residual_b": float(res.residual_b[0]),
        "redistribution": None if not ps.use_rollout else ("R^T gamma" if transpose else "R gamma"),
        "files": files,
    }
    doc = {
        "vitscope_version": vitscope.__version__, "python": platform.python_version(),
        "config": {"command": "explain-pair", "model": model, "projection": proj or "none", "pooling": pool,
                   "rollout": ps.use_rollout, "transpose": transpose, "format": fmt},
        "models": {model: backbone.spec.to_dict()},
        "data": {"a": str(Path(path_a).resolve()), "b": str(Path(path_b).resolve())},
        "analyses": {"paired_similarity": summary},
    }
    (outdir / "results.json").write_text(json.dumps(doc, indent=1))
    return doc
