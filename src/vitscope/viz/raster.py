"""Raster figures drawn with numpy and Pillow: grids of attention maps and overlays on photographs.

A blocks x heads grid of maps is pixels with a few labels; matplotlib spent 0.3-0.9 s on each (layout, a
dense ``imshow``, text), which made drawing most of the writing time of a run. Here a grid is a colour-map
lookup, an integer upscale and a paste, with labels set in Pillow's bundled font: tens of milliseconds.
Colour maps are matplotlib's (only :mod:`matplotlib.colors` is used, never a figure).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont, PngImagePlugin

from vitscope.errors import VitscopeValueError

__all__ = ["TEXT_PX_KEY", "Canvas", "colorize", "fit_nearest", "font", "smallest_text_px", "tick_positions",
           "tile_scale", "upscale", "value_overlay"]

#: PNG text chunk holding the smallest font size (pixels per em) a figure file uses: the report shows how
#: large that text appears on the page, and the browser tests hold it to a readable size
TEXT_PX_KEY = "vitscope:smallest-text-px"

#: side in pixels a map tile is scaled up to, at least (integer factors: every token stays a square)
TILE_PIXELS = 48
_WHITE = (255, 255, 255)
_INK = (29, 35, 48)
_MUTED = (91, 100, 117)


@cache
def _lut(cmap: str) -> np.ndarray:
    """``[256, 3]`` uint8 colours of a matplotlib colour map."""
    import matplotlib

    return (matplotlib.colormaps[cmap](np.linspace(0.0, 1.0, 256))[:, :3] * 255 + 0.5).astype(np.uint8)


@cache
def font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """DejaVu Sans (matplotlib's, so the same letters as the matplotlib figures) at ``size`` pixels: class and file
    names in Latin, Greek and Cyrillic scripts draw as written, where Pillow's bundled font has ASCII only."""
    import matplotlib

    path = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
    try:
        return ImageFont.truetype(str(path), size=size)
    except OSError:  # a matplotlib without its fonts
        return ImageFont.load_default(size=size)


def colorize(values: np.ndarray, cmap: str, vmin: float = 0.0, vmax: float = 1.0,
             bad: tuple[int, int, int] = _WHITE) -> np.ndarray:
    """``[..., 3]`` uint8 colours of ``values`` (any shape) on ``cmap`` between ``vmin`` and ``vmax``;
    NaN is ``bad``."""
    arr = np.asarray(values, dtype=np.float64)
    span = vmax - vmin if vmax > vmin else 1.0
    finite = np.isfinite(arr)
    index = np.clip(np.where(finite, (arr - vmin) / span, 0.0) * 255 + 0.5, 0, 255).astype(np.uint8)
    out = _lut(cmap)[index]
    out[~finite] = bad
    return out


def value_overlay(photo: np.ndarray, values: np.ndarray, cmap: str, strength: float = 0.8) -> np.ndarray:
    """A map over a photograph: the photo in grey, each pixel blended towards the map's colour by its value.

    A value of 0 leaves the grey photo as it is, so only what the map marks is coloured: no tint over the whole
    image and no coloured strips along its edges where a map is low (the published jet blend coloured
    everything, blue where the map was low).

    Args:
        photo: ``[H, W, 3]`` uint8.
        values: ``[H, W]`` in [0, 1] (already at the photo's size; NaN: no value, left grey).
        cmap: a matplotlib colour map (sequential: its top colour marks the highest values).
        strength: the blend at value 1.

    Returns:
        ``[H, W, 3]`` uint8.
    """
    v = np.clip(np.nan_to_num(np.asarray(values, dtype=np.float32), nan=0.0), 0.0, 1.0)
    if v.shape != photo.shape[:2]:
        raise VitscopeValueError(f"values of shape {v.shape} over a photo of {photo.shape[:2]}")
    grey = np.asarray(photo, dtype=np.float32).mean(axis=-1, keepdims=True)
    alpha = strength * v[..., None]
    colour = colorize(v, cmap).astype(np.float32)
    return np.round((1 - alpha) * grey + alpha * colour).astype(np.uint8)


def tile_scale(a: int, b: int, target: int = TILE_PIXELS) -> int:
    """Integer upscale factor that brings an ``a x b`` map to about ``target`` pixels on its longer side."""
    return max(1, round(target / max(a, b, 1)))


def upscale(rgb: np.ndarray, factor: int) -> np.ndarray:
    """Nearest-neighbour upscale of ``[h, w, C]`` by an integer factor."""
    return rgb if factor == 1 else np.repeat(np.repeat(rgb, factor, axis=0), factor, axis=1)


def fit_nearest(m: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Nearest-neighbour resize of a ``[h, w]`` map to ``size = (rows, cols)`` (token maps over photographs)."""
    rows = (np.arange(size[0]) * m.shape[0] // size[0]).clip(0, m.shape[0] - 1)
    cols = (np.arange(size[1]) * m.shape[1] // size[1]).clip(0, m.shape[1] - 1)
    return m[rows][:, cols]


class Canvas:
    """A white picture that grows as parts are placed, then written as PNG.

    Parts are placed at absolute pixel positions (right and down of the origin); the picture is enlarged
    whenever a part reaches past its edge, so the first size is only a guess, and :meth:`save` crops to what
    was placed plus a margin.
    """

    def __init__(self, width: int, height: int, margin: int = 10) -> None:
        self.image = Image.new("RGB", (max(1, width), max(1, height)), _WHITE)
        self.draw = ImageDraw.Draw(self.image)
        self.margin = margin
        self._right, self._bottom = 0, 0
        self.smallest_text: int | None = None  # font size in pixels of the smallest text placed

    def _extend(self, right: int, bottom: int) -> None:
        """Note the placed extent, enlarging the picture (with room to spare) when it reaches past an edge."""
        self._right, self._bottom = max(self._right, right), max(self._bottom, bottom)
        need_w, need_h = self._right + self.margin, self._bottom + self.margin
        if need_w > self.image.width or need_h > self.image.height:
            bigger = Image.new("RGB", (max(self.image.width, need_w + need_w // 4),
                                       max(self.image.height, need_h + need_h // 4)), _WHITE)
            bigger.paste(self.image, (0, 0))
            self.image, self.draw = bigger, ImageDraw.Draw(bigger)

    def paste(self, rgb: np.ndarray, x: int, y: int) -> None:
        """Place ``[h, w, 3]`` uint8 pixels with their top-left corner at ``(x, y)``."""
        self._extend(x + rgb.shape[1], y + rgb.shape[0])
        self.image.paste(Image.fromarray(np.ascontiguousarray(rgb)), (x, y))

    def text(self, x: float, y: float, text: str, size: int = 13, anchor: str = "la", fill=_INK) -> None:
        """Write ``text`` at ``(x, y)``; ``anchor`` is Pillow's (``"la"`` left-top, ``"mm"`` centre...)."""
        box = self.draw.textbbox((x, y), text, font=font(size), anchor=anchor)
        self._extend(int(box[2]) + 1, int(box[3]) + 1)
        if text.strip():
            self.smallest_text = size if self.smallest_text is None else min(self.smallest_text, size)
        self.draw.text((x, y), text, font=font(size), anchor=anchor, fill=fill)

    def text_width(self, text: str, size: int = 13) -> int:
        """Width in pixels of ``text`` set at ``size``."""
        box = self.draw.textbbox((0, 0), text, font=font(size))
        return int(box[2] - box[0])

    def colour_bar(self, x: int, y: int, width: int, cmap: str, low: str, high: str, label: str) -> int:
        """A horizontal colour bar with its end labels and a label; returns the y below it."""
        bar = colorize(np.tile(np.linspace(0.0, 1.0, width), (10, 1)), cmap)
        self.paste(bar, x, y)
        self.text(x, y + 13, low, size=11, fill=_MUTED)
        self.text(x + width, y + 13, high, size=11, anchor="ra", fill=_MUTED)
        self.text(x + width // 2, y + 27, label, size=11, anchor="ma", fill=_MUTED)
        return y + 44

    def save(self, stem: str | Path) -> list[Path]:
        """Crop to the placed parts plus the margin and write ``<stem>.png``; returns ``[path]``."""
        stem = Path(stem)
        stem = stem.with_suffix("") if stem.suffix == ".png" else stem
        stem.parent.mkdir(parents=True, exist_ok=True)
        right = min(self.image.width, self._right + self.margin)
        bottom = min(self.image.height, self._bottom + self.margin)
        path = stem.parent / f"{stem.name}.png"
        info = PngImagePlugin.PngInfo()
        if self.smallest_text is not None:
            info.add_text(TEXT_PX_KEY, str(self.smallest_text))
        self.image.crop((0, 0, right, bottom)).save(path, compress_level=3, pnginfo=info)  # level 3: 2x faster
        return [path]


def smallest_text_px(path: str | Path) -> float | None:
    """The smallest font size (pixels per em) a figure file written by vitscope uses, or None when it has no
    text or was not written by vitscope."""
    with Image.open(path) as image:
        value = getattr(image, "text", {}).get(TEXT_PX_KEY)
    return float(value) if value else None


def tick_positions(count: int, most: int = 24) -> Sequence[int]:
    """Every index up to ``most`` labels, then every k-th."""
    return range(0, count, max(1, int(np.ceil(count / most))))
