"""Block x head explorer data: every head's attention map as a tiny PNG (the browser enlarges it).

Each map is min-max scaled on its own (heads differ in range; the range is kept for the caption) and
coloured with a perceptually uniform colour map. Cells stay at the token-grid resolution (e.g. 8 x 8
pixels) so a whole explorer weighs a few kilobytes; CSS scales them up pixelated in the grid and smooth in
the enlarged view, drawn over the image itself for single-image maps.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from functools import cache

import numpy as np
import torch

from vitscope.errors import VitscopeValueError
from vitscope.report.model import Explorer, ExplorerGrid

__all__ = ["colour_palette", "explorer_from_maps", "jpeg_bytes", "palette_png"]


def jpeg_bytes(rgb: np.ndarray, quality: int = 85) -> bytes:
    """JPEG encoding of an ``[H, W, 3]`` uint8 photo (the picture under an explorer's maps)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(rgb[..., :3])).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def palette_png(levels: np.ndarray, palette: np.ndarray, alpha: np.ndarray | None = None) -> bytes:
    """PNG of ``[H, W]`` indices into ``palette`` ``[256, 3]`` uint8 (8 bits a pixel: a colour-mapped map is
    stored exactly, in a third of the bytes of RGB); ``alpha``: ``[256]`` uint8 opacity of each entry (a map
    drawn over a photo lets it show where the map says little)."""
    from PIL import Image

    image = Image.fromarray(np.ascontiguousarray(levels, dtype=np.uint8), mode="P")
    image.putpalette(np.ascontiguousarray(palette, dtype=np.uint8).reshape(-1).tolist())
    buf = io.BytesIO()
    extra = {} if alpha is None else {"transparency": bytes(np.asarray(alpha, dtype=np.uint8).tolist())}
    image.save(buf, format="PNG", optimize=True, **extra)
    return buf.getvalue()


@cache
def colour_palette(cmap: str) -> np.ndarray:
    """``[256, 3]`` uint8 colours of a matplotlib colour map, resampled to 256 entries."""
    import matplotlib

    return matplotlib.colormaps[cmap].resampled(256)(np.arange(256), bytes=True)[:, :3]


def css_gradient(cmap: str, stops: int = 11) -> str:
    """A CSS ``linear-gradient`` left to right through a colour map (a colour bar drawn by the page)."""
    palette = colour_palette(cmap)
    colours = [palette[round(i * 255 / (stops - 1))] for i in range(stops)]
    return "linear-gradient(to right, " + ", ".join(f"#{r:02x}{g:02x}{b:02x}" for r, g, b in colours) + ")"


def _coloured(m: np.ndarray, cmap: str) -> tuple[bytes, tuple[float, float]]:
    lo, hi = float(np.nanmin(m)), float(np.nanmax(m))
    scaled = (m - lo) / (hi - lo) if hi > lo else np.zeros_like(m)
    # the colour map's own lookup: index = floor(value * 256), the top value in the last entry
    levels = np.clip((np.nan_to_num(scaled) * 256).astype(np.int64), 0, 255)
    return palette_png(levels, colour_palette(cmap)), (lo, hi)


def _grid(label: str, maps: np.ndarray, cmap: str, image: np.ndarray | None) -> ExplorerGrid:
    cells, ranges = [], []
    for block_maps in maps:
        row = [_coloured(m, cmap) for m in block_maps]
        cells.append([c for c, _ in row])
        ranges.append([r for _, r in row])
    return ExplorerGrid(label, cells, ranges, None if image is None else jpeg_bytes(image))


def explorer_from_maps(
    title: str,
    mean_map: torch.Tensor | np.ndarray,
    blocks: Sequence[int] | None = None,
    image_maps: torch.Tensor | np.ndarray | None = None,
    images: torch.Tensor | np.ndarray | None = None,
    image_labels: Sequence[str] | None = None,
    max_images: int = 4,
    caption: str = "",
    paper: str = "",
    cmap: str = "inferno",
) -> Explorer:
    """An :class:`Explorer` of a dataset-mean map and optionally single-image maps.

    Args:
        title: heading of the explorer.
        mean_map: ``[L, H, h, w]`` dataset-average map of every block and head.
        blocks: block number of each row (default ``0..L-1``).
        image_maps: ``[I, L, H, h, w]`` maps of single images; images: ``[I, H_px, W_px, 3]`` uint8 pictures.
        image_labels: button text of each image (default ``image <i>``).
        max_images: at most this many single-image grids (the report stays small).
        caption, paper: text under the explorer and the paper figure it reproduces.
        cmap: matplotlib colour map.
    """
    mean = np.asarray(torch.as_tensor(mean_map).double().cpu().numpy())
    if mean.ndim != 4:
        raise VitscopeValueError(f"mean_map must be [L, H, h, w], got shape {tuple(mean.shape)}")
    grids = [_grid("dataset mean", mean, cmap, None)]
    if image_maps is not None:
        per_image = np.asarray(torch.as_tensor(image_maps).double().cpu().numpy())
        pictures = None if images is None else np.asarray(torch.as_tensor(images).cpu().numpy(), dtype=np.uint8)
        for i in range(min(len(per_image), max_images)):
            label = image_labels[i] if image_labels is not None else f"image {i}"
            grids.append(_grid(label, per_image[i], cmap, None if pictures is None else pictures[i]))
    labels = list(blocks) if blocks is not None else list(range(mean.shape[0]))
    return Explorer(title, [int(b) for b in labels], int(mean.shape[1]), grids, caption, paper,
                    (int(mean.shape[2]), int(mean.shape[3])), css_gradient(cmap))
