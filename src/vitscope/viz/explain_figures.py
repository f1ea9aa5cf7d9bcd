"""Figures of paired similarity maps (paper 000 figures 5 to 10; matplotlib object API, no pyplot).

Paired similarity maps decompose the cosine similarity over the patches: :func:`signed_overlay` upsamples a map
bicubically and colours it on a diverging map around its even share (``sum / tokens``, the cosine's when the map
keeps its sum: red, a patch adds more than that; blue, less, or takes away), over a grey copy of the image, with the
scale on a colour bar.
:func:`heat_overlay` shows the output-agnostic rollout maps, which are not signed: min-max normalised as the
published code does, then coloured only where they are high (not the published jet blend, which tinted the
whole image and drew blue strips along edges where a map was low).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.figure import Figure

from vitscope.functional.faithfulness import curve_area
from vitscope.functional.similarity import display_map, upsample_maps
from vitscope.viz.save import outside_legend, save_figure

__all__ = ["SIGNED_CMAP", "class_maps_figure", "even_share_scale", "faithfulness_figure",
           "heat_overlay", "models_figure", "pair_figure", "pose_similarity_figure", "retrieval_figure",
           "signed_map_picture", "signed_overlay", "signed_pair_picture", "to_rgb"]

#: diverging colour map of signed similarity maps (blue: negative, white: zero, red: positive)
SIGNED_CMAP = "RdBu_r"

_GREEN, _RED = (0.1, 0.75, 0.2), (0.85, 0.15, 0.1)


def to_rgb(image: torch.Tensor | np.ndarray) -> np.ndarray:
    """``[3, H, W]`` or ``[H, W, 3]`` uint8 (tensor or array) -> ``[H, W, 3]`` uint8 array."""
    arr = image.detach().cpu().numpy() if isinstance(image, torch.Tensor) else np.asarray(image)
    if arr.ndim == 3 and arr.shape[0] == 3 and arr.shape[-1] != 3:
        arr = arr.transpose(1, 2, 0)
    return arr.astype(np.uint8)


def heat_overlay(image: torch.Tensor | np.ndarray, grid_map: torch.Tensor) -> np.ndarray:
    """An unsigned ``[h, w]`` map (e.g. rollout) over an image: ``[H, W, 3]`` uint8.

    The map is upsampled and min-max normalised as displayed (:func:`~vitscope.functional.display_map`), then
    drawn with :func:`~vitscope.viz.raster.value_overlay` (inferno over the grey image, colour only where high).
    """
    from vitscope.viz.raster import value_overlay

    rgb = to_rgb(image)
    shown = display_map(torch.as_tensor(grid_map).reshape(1, *grid_map.shape[-2:]), rgb.shape[:2])[0].numpy()
    return value_overlay(rgb, shown, "inferno")


def _signed(image: torch.Tensor | np.ndarray, grid_map: torch.Tensor | np.ndarray) -> np.ndarray:
    """A paired map over its image, around its own even share."""
    centre, limit = even_share_scale(grid_map)
    return signed_overlay(image, grid_map, limit, centre)


def signed_overlay(image: torch.Tensor | np.ndarray, grid_map: torch.Tensor | np.ndarray,
                   limit: float | None = None, centre: float = 0.0) -> np.ndarray:
    """A signed ``[h, w]`` map over an image: ``[H, W, 3]`` uint8 on :data:`SIGNED_CMAP`, white at ``centre``.

    Args:
        image: ``[3, H, W]`` or ``[H, W, 3]`` uint8.
        grid_map: the token map (any sign).
        limit: the distance from ``centre`` shown at full colour (default: the largest of this map); give one
            limit to the maps that should be compared (both images of a pair).
        centre: the value shown white (0: sign; a map's even share ``sum / tokens``: above or below it).

    Returns:
        The image in grey, each pixel blended towards the map's colour by ``|value - centre| / limit``.
    """
    rgb = to_rgb(image).astype(np.float32) / 255.0
    grid = torch.as_tensor(np.asarray(grid_map, dtype=np.float32))
    up = upsample_maps(grid.reshape(1, *grid.shape[-2:]), rgb.shape[:2])[0].numpy() - float(centre)
    lim = float(limit) if limit is not None else float(np.abs(up).max())
    lim = lim if lim > 0 else 1.0
    colour = colormaps[SIGNED_CMAP](np.clip(0.5 + 0.5 * up / lim, 0.0, 1.0))[..., :3].astype(np.float32)
    grey = rgb.mean(axis=-1, keepdims=True).repeat(3, axis=-1)
    alpha = np.clip(np.abs(up) / lim, 0.0, 1.0)[..., None] * 0.8
    return np.uint8(np.round(255 * ((1 - alpha) * grey + alpha * colour)))


def even_share_scale(grid_map: torch.Tensor | np.ndarray) -> tuple[float, float]:
    """``(centre, limit)`` of one paired map: its even share ``sum / tokens`` (the contribution of every patch if
    all contributed alike) and the largest distance of a token from it."""
    a = np.asarray(grid_map, dtype=np.float64)
    centre = float(a.sum() / a.size)
    limit = float(np.abs(a - centre).max())
    return centre, limit if limit > 0 else max(abs(centre), 1e-12)


def _paste_signed(canvas, image: np.ndarray, grid_map: torch.Tensor | np.ndarray, scale: tuple[float, float],
                  x: int, y: int, side: int, label: str) -> int:
    """Place one :func:`signed_overlay` (longer side ``side``) at ``(x, y)`` with its colour bar under it;
    ``label`` may name ``{centre}`` and ``{spread}`` (how far the bar's ends are from the centre, in percent of
    it: a map within 1 % of an even share is drawn as saturated as one within 100 %). Returns the y below the
    bar."""
    from PIL import Image

    centre, limit = scale
    pic = Image.fromarray(signed_overlay(image, grid_map, limit, centre))
    factor = side / max(pic.size)
    pic = pic.resize((max(1, round(pic.width * factor)), max(1, round(pic.height * factor))), Image.BICUBIC)
    canvas.paste(np.asarray(pic), x, y)
    return canvas.colour_bar(x, y + pic.height + 8, pic.width, SIGNED_CMAP, f"{centre - limit:.3g}",
                             f"{centre + limit:.3g}", label.format(centre=centre, spread=spread_text(centre, limit)))


def spread_text(centre: float, limit: float) -> str:
    """How far a signed map's colour-bar ends lie from its centre, in percent of the centre (``"ends ±620 % of
    it"``): a map within 1 % of an even share is drawn as saturated as one within 600 %."""
    if not centre:
        return "centre 0"
    percent = 100 * limit / abs(centre)
    return f"ends \u00b1{percent:.0f} % of it" if percent >= 10 else f"ends \u00b1{percent:.2g} % of it"


def signed_pair_picture(rows: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]],
                        stem: str | Path, side: int = 224) -> list[Path]:
    """Pairs over each other, each image with its map and colour bar (Pillow, no matplotlib).

    Args:
        rows: per pair ``(image a [H, W, 3], image b, map a [h, w], map b, title)``; each map is shown around its
            even share (:func:`even_share_scale`): red, a patch contributes more; blue, less.
        stem: output path without suffix (``<stem>.png`` is written).
        side: pixels of each image's longer side.
    """
    from vitscope.viz.raster import Canvas

    canvas = Canvas(2 * side + 40, len(rows) * (side + 110))
    y = 10
    for image_a, image_b, map_a, map_b, title in rows:
        canvas.text(10, y, title, size=13)
        y += 22
        below = y
        for k, (img, m) in enumerate(((image_a, map_a), (image_b, map_b))):
            below = max(below, _paste_signed(canvas, img, m, even_share_scale(m), 10 + k * (side + 20), y, side,
                                             "white: an even share, {centre:.3g}; {spread}"))
        y = below + 6
    return canvas.save(stem)


def signed_map_picture(image: np.ndarray, grid_map: torch.Tensor | np.ndarray, scale: tuple[float, float],
                       title: str, stem: str | Path, side: int = 320) -> list[Path]:
    """One image with its map and a colour bar (Pillow): :func:`signed_overlay` at ``scale = (centre, limit)``
    (:func:`even_share_scale` of the pair)."""
    from vitscope.viz.raster import Canvas

    canvas = Canvas(side + 20, side + 90)
    canvas.text(10, 10, title, size=13)
    _paste_signed(canvas, image, grid_map, scale, 10, 32, side, "patch contribution (white: an even share, "
                  "{centre:.3g}; {spread})")
    return canvas.save(stem)


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
    """Figures 1 and 8: each image in a row with its paired map and (if given) its output-agnostic rollout map."""
    from vitscope.viz.labels import short_name

    a, b = (short_name(n, 34) for n in names)  # titles fit their panel
    rows = [[(to_rgb(image_a), a), (_signed(image_a, map_a), "paired map (given the other)")],
            [(to_rgb(image_b), b), (_signed(image_b, map_b), "paired map (given the other)")]]
    for row, image, rollout in ((rows[0], image_a, rollout_a), (rows[1], image_b, rollout_b)):
        if rollout is not None:
            row.append((heat_overlay(image, rollout), "rollout"))
    cols = max(len(r) for r in rows)
    fig = Figure(figsize=(1.9 * cols, 4.4), layout="constrained")
    fig.suptitle(f"cosine similarity {score:.3f}\npaired maps: red, a patch adds more than an even share of the map; "
                 "blue, less", fontsize=8)
    axes = []
    for r, row in enumerate(rows):
        for c, (img, title) in enumerate(row):
            axes.append(fig.add_subplot(2, cols, r * cols + c + 1))
            _show(axes[-1], img, title)
    _scale_bar(fig, axes, SIGNED_CMAP, ["below an even share", "an even share", "above"])
    if rollout_a is not None or rollout_b is not None:
        _scale_bar(fig, axes, "inferno", ["rollout: low", "", "high"])
    return save_figure(fig, path, dpi=120, svg=False, tight=True)[0]


def _scale_bar(fig, axes, cmap: str, labels: Sequence[str]) -> None:
    """A horizontal colour bar under ``axes``: three labels at its ends and middle (each map on its own scale,
    so no numbers)."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    bar = fig.colorbar(ScalarMappable(Normalize(0, 1), cmap), ax=axes, location="bottom", shrink=0.5, aspect=40,
                       pad=0.02)
    bar.set_ticks([0.0, 0.5, 1.0], labels=list(labels), fontsize=7)


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
                _show(fig.add_subplot(rows, k + 1, row * (k + 1) + j + 2), _signed(images[g], res.gallery_maps[qi, j]),
                      f"{float(res.scores[qi, j]):.2f}", _GREEN if bool(res.correct[qi, j]) else _RED)
    fig.tight_layout()
    return save_figure(fig, path, dpi=120, svg=False)[0]


def class_maps_figure(images: torch.Tensor, queries: Sequence[int], maps: torch.Tensor, path: str | Path) -> Path:
    """Figure 5: each query image above its class similarity map."""
    n = len(queries)
    fig = Figure(figsize=(1.5 * n, 3.2))
    for i, q in enumerate(queries):
        _show(fig.add_subplot(2, n, i + 1), to_rgb(images[int(q)]), f"image {int(q)}")
        _show(fig.add_subplot(2, n, n + i + 1), _signed(images[int(q)], maps[i]), "class map")
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
            _show(fig.add_subplot(len(maps), n + 1, r * (n + 1) + j + 2), _signed(imgs[j], m[j]), title)
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
                mean = c[mode].double().mean(0)
                area = float(curve_area(mean[None], fractions)[0])  # over the shares the steps removed
                ax.plot(fractions.numpy(), mean.numpy(), label=f"{order} (area {area:.3f})")
        ax.set_xlabel("fraction of patches " + ("removed" if mode == "deletion" else "revealed"))
        ax.set_ylabel("cosine similarity")
        ax.set_title(mode, fontsize=9)
        outside_legend(ax, fontsize=7)
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
    outside_legend(ax, fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path, dpi=120, svg=False)[0]
