"""Writing a matplotlib figure: one function for every figure module.

A figure is written as ``<stem>.png`` and, when it is drawn with lines and small heatmaps, also as
``<stem>.svg`` for papers. Figures of photographs (attention maps over images, keypoints, panels) get no SVG:
an SVG of a raster only wraps the same pixels in a bigger file.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.text import Text

from vitscope.viz.raster import TEXT_PX_KEY

__all__ = ["RASTER_PIXELS", "is_vector", "outside_legend", "save_figure"]

#: image pixels (summed over every ``imshow`` of the figure) above which a figure is a raster figure
RASTER_PIXELS = 128 * 128


def is_vector(fig: Figure) -> bool:
    """True when the figure's images hold at most :data:`RASTER_PIXELS` pixels in all (heatmaps, curves)."""
    pixels = 0
    for ax in fig.axes:
        for image in ax.get_images():
            if isinstance(image, AxesImage):
                shape = image.get_array().shape
                pixels += int(shape[0]) * int(shape[1])
    return pixels <= RASTER_PIXELS


def outside_legend(ax, *args, **kwargs):
    """A legend outside the plotting area, so it never hides a curve or a reference line (:func:`save_figure`
    then crops the figure around it): beside the axes, or under them when a twin axis holds the right side."""
    kwargs.pop("loc", None)
    twin = any(other is not ax and other.bbox.bounds == ax.bbox.bounds for other in ax.figure.axes)
    if twin:
        return ax.legend(*args, loc="upper center", bbox_to_anchor=(0.5, -0.18), borderaxespad=0.0,
                         frameon=False, ncols=4, **kwargs)
    return ax.legend(*args, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False,
                     **kwargs)


def save_figure(fig: Figure, stem: str | Path, dpi: int = 150, svg: bool | None = None,
                tight: bool = False, layout: bool = False) -> list[Path]:
    """Write ``<stem>.png`` and, for vector figures, ``<stem>.svg``; returns the paths and releases the figure.

    Args:
        fig: the figure (matplotlib's object API; it is cleared afterwards).
        stem: path without suffix (a given ``.png`` suffix is dropped); the folder is created.
        dpi: resolution of the PNG.
        svg: write the SVG (None: when :func:`is_vector`).
        tight: crop the figure to its contents (``bbox_inches="tight"``).
        layout: run ``fig.tight_layout()`` first.
    """
    stem = Path(stem)
    stem = stem.with_suffix("") if stem.suffix == ".png" else stem
    stem.parent.mkdir(parents=True, exist_ok=True)
    legends = any(ax.get_legend() is not None for ax in fig.axes)  # legends outside the axes: keep them in
    extra = {"bbox_inches": "tight"} if tight or legends else {}
    # titles and labels carry user text (file, class and model names): a "$" pair in it is drawn as written,
    # never parsed as matplotlib math (vitscope draws no math); tick labels made while drawing follow the rc
    for text in fig.findobj(Text):
        text.set_parse_math(False)
    try:
        with matplotlib.rc_context({"text.parse_math": False}):
            if layout:
                fig.tight_layout()
            paths = [stem.parent / f"{stem.name}.png"]
            fig.draw_without_rendering()  # tick labels get their text when drawn: measure what is drawn
            sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
            metadata = {TEXT_PX_KEY: f"{min(sizes) * dpi / 72:.1f}"} if sizes else {}
            fig.savefig(paths[0], dpi=dpi, metadata=metadata, **extra)
            if is_vector(fig) if svg is None else svg:
                paths.append(stem.parent / f"{stem.name}.svg")
                fig.savefig(paths[1], **extra)
    finally:
        fig.clear()
    return paths
