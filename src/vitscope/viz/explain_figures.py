"""Figures of paired similarity maps (paper 000 figures 5 to 10; matplotlib object API, no pyplot).

Overlays follow docs/methods.md, Paired image similarity and the published code: the map is upsampled bicubically to the
image size, min-max normalised, coloured with jet, added to the image and the sum rescaled to its max.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.figure import Figure

from vitscope.functional.similarity import display_map
from vitscope.viz.save import save_figure

__all__ = ["class_maps_figure", "faithfulness_figure", "models_figure", "overlay", "pair_figure",
           "pose_similarity_figure", "retrieval_figure", "to_rgb"]

_GREEN, _RED = (0.1, 0.75, 0.2), (0.85, 0.15, 0.1)


def to_rgb(image: torch.Tensor | np.ndarray) -> np.ndarray:
    """``[3, H, W]`` or ``[H, W, 3]`` uint8 (tensor or array) -> ``[H, W, 3]`` uint8 array."""
    arr = image.detach().cpu().numpy() if isinstance(image, torch.Tensor) else np.asarray(image)
    if arr.ndim == 3 and arr.shape[0] == 3 and arr.shape[-1] != 3:
        arr = arr.transpose(1, 2, 0)
    return arr.astype(np.uint8)


def overlay(image: torch.Tensor | np.ndarray, grid_map: torch.Tensor) -> np.ndarray:
    """Jet overlay of a ``[h, w]`` map on an image: ``[H, W, 3]`` uint8 (the published code's blend)."""
    rgb = to_rgb(image).astype(np.float32) / 255.0
    shown = display_map(grid_map.reshape(1, *grid_map.shape[-2:]), rgb.shape[:2])[0].numpy()
    heat = colormaps["jet"](shown)[..., :3].astype(np.float32)
    blend = heat + rgb
    return np.uint8(255 * blend / blend.max())


def _show(ax, img: np.ndarray, title: str = "", border: tuple[float, float, float] | None = None) -> None:
    ax.imshow(img, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=7)
    for spine in ax.spines.values():
        spine.set_visible(border is not None)
        if border is not None:
            spine.set_color(border)
            spine.set_linewidth(3)


def pair_figure(image_a, image_b, map_a: torch.Tensor, map_b: torch.Tensor, score: float, path: str | Path,
                rollout_a: torch.Tensor | None = None, rollout_b: torch.Tensor | None = None,
                names: tuple[str, str] = ("A", "B")) -> Path:
    """Figures 1 and 8: both images, their paired maps and (if given) their output-agnostic rollout maps."""
    a, b = names
    panels = [(to_rgb(image_a), a), (overlay(image_a, map_a), f"{a}|{b}")]
    if rollout_a is not None:
        panels.append((overlay(image_a, rollout_a), f"rollout {a}"))
    panels += [(to_rgb(image_b), b), (overlay(image_b, map_b), f"{b}|{a}")]
    if rollout_b is not None:
        panels.append((overlay(image_b, rollout_b), f"rollout {b}"))
    fig = Figure(figsize=(1.7 * len(panels), 2.1))
    fig.suptitle(f"cosine similarity {score:.3f}", fontsize=9)
    for i, (img, title) in enumerate(panels):
        _show(fig.add_subplot(1, len(panels), i + 1), img, title)
    return save_figure(fig, path, dpi=120, svg=False)[0]


def retrieval_figure(images: torch.Tensor, results: Mapping[str, object], path: str | Path,
                     max_queries: int = 4) -> Path:
    """Figure 9: each query, then per model its top-k (green border: correct) with their maps.

    Args:
        images: ``[G, 3, H, W]`` uint8 gallery.
        results: ``{model: RetrievalExplanation}`` over the same queries.
        path: output PNG.
        max_queries: queries drawn.
    """
    first = next(iter(results.values()))
    nq, k = min(max_queries, len(first.queries)), first.indices.shape[1]
    rows = nq * len(results)
    fig = Figure(figsize=(1.3 * (k + 1), 1.4 * rows))
    for qi in range(nq):
        for mi, (name, res) in enumerate(results.items()):
            row = qi * len(results) + mi
            q = int(res.queries[qi])
            _show(fig.add_subplot(rows, k + 1, row * (k + 1) + 1), to_rgb(images[q]),
                  f"query {q}\n{name}" if mi == 0 else name)
            for j in range(k):
                g = int(res.indices[qi, j])
                _show(fig.add_subplot(rows, k + 1, row * (k + 1) + j + 2), overlay(images[g], res.gallery_maps[qi, j]),
                      f"{float(res.scores[qi, j]):.2f}", _GREEN if bool(res.correct[qi, j]) else _RED)
    fig.tight_layout()
    return save_figure(fig, path, dpi=120, svg=False)[0]


def class_maps_figure(images: torch.Tensor, queries: Sequence[int], maps: torch.Tensor, path: str | Path) -> Path:
    """Figure 5: each query image above its class similarity map."""
    n = len(queries)
    fig = Figure(figsize=(1.5 * n, 3.2))
    for i, q in enumerate(queries):
        _show(fig.add_subplot(2, n, i + 1), to_rgb(images[int(q)]), f"image {int(q)}")
        _show(fig.add_subplot(2, n, n + i + 1), overlay(images[int(q)], maps[i]), "class map")
    return save_figure(fig, path, dpi=120, svg=False)[0]


def models_figure(image_a: torch.Tensor, images_b: Sequence[torch.Tensor], maps: Mapping[str, torch.Tensor],
                  path: str | Path, scores: Mapping[str, Sequence[float]] | None = None) -> Path:
    """Figures 6 and 7: one row per model (checkpoint or patch size) of maps of ``images_b`` against ``image_a``.

    Args:
        image_a: the query image (drawn first in each row).
        images_b: the n images whose maps are shown (per model, the same or that model's top-n).
        maps: ``{model: [n, h, w]}`` maps of ``images_b`` (any grid; each is upsampled to the image).
        scores: optional ``{model: n scores}`` for the titles.
    """
    n = len(images_b) if not isinstance(images_b, Mapping) else len(next(iter(images_b.values())))
    fig = Figure(figsize=(1.4 * (n + 1), 1.5 * len(maps)))
    for r, (name, m) in enumerate(maps.items()):
        imgs = images_b[name] if isinstance(images_b, Mapping) else images_b
        _show(fig.add_subplot(len(maps), n + 1, r * (n + 1) + 1), to_rgb(image_a), name)
        for j in range(n):
            title = f"{scores[name][j]:.2f}" if scores else ""
            _show(fig.add_subplot(len(maps), n + 1, r * (n + 1) + j + 2), overlay(imgs[j], m[j]), title)
    fig.tight_layout()
    return save_figure(fig, path, dpi=120, svg=False)[0]


def faithfulness_figure(fractions: torch.Tensor, curves: Mapping[str, Mapping[str, torch.Tensor]],
                        path: str | Path) -> Path:
    """Mean deletion and insertion curves per patch order (areas in the legend)."""
    modes = sorted({m for c in curves.values() for m in c})
    fig = Figure(figsize=(4.2 * len(modes), 3.2))
    for i, mode in enumerate(modes):
        ax = fig.add_subplot(1, len(modes), i + 1)
        for order, c in curves.items():
            if mode in c:
                mean = c[mode].double().mean(0).numpy()
                area = float(((mean[1:] + mean[:-1]) / 2).mean())
                ax.plot(fractions.numpy(), mean, label=f"{order} (area {area:.3f})")
        ax.set_xlabel("fraction of patches " + ("removed" if mode == "deletion" else "revealed"))
        ax.set_ylabel("cosine similarity")
        ax.set_title(mode, fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path, dpi=120, svg=False)[0]


def pose_similarity_figure(per_model: Mapping[str, Sequence[float]], path: str | Path) -> Path:
    """Figure 10: mean pose similarity to the query at each rank, one line per model."""
    fig = Figure(figsize=(4.2, 3.0))
    ax = fig.add_subplot()
    for name, values in per_model.items():
        ax.plot(np.arange(1, len(values) + 1), values, marker="o", label=name)
    ax.set_xlabel("rank of the retrieved image")
    ax.set_ylabel("pose similarity to the query")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path, dpi=120, svg=False)[0]
