"""Every view maps keypoints to where its transform moves the pixels under them."""

import dataclasses

import numpy as np
import pytest
from PIL import Image

from vitscope.models.views import FrameView, LetterboxView, LongSideView, StandardView, TiledView
from vitscope.models.wrap import build_tiny_vit

VIEWS = [StandardView(), LongSideView(), LetterboxView(), FrameView(multiple=16), TiledView(),
         TiledView(inner=LetterboxView())]


SPEC = build_tiny_vit("t", image_size=64, depth=1, embed_dim=16, num_heads=1).spec


def _blob_centre(frame: Image.Image) -> np.ndarray:
    """(x, y) intensity-weighted centre of a mode ``"L"`` frame, in pixel-index coordinates."""
    a = np.asarray(frame, dtype=np.float64)
    ys, xs = np.indices(a.shape)
    return np.array([(xs * a).sum(), (ys * a).sum()]) / a.sum()


@pytest.mark.parametrize("resize", [None, 72], ids=["resize-64", "resize-72"])
@pytest.mark.parametrize("view", VIEWS, ids=lambda v: v.name + ("-inner" if getattr(v, "inner", None) else ""))
@pytest.mark.parametrize("hw", [(150, 220), (300, 120), (48, 40)])
def test_points_follow_the_pixels(view, hw, resize):
    spec = dataclasses.replace(SPEC, resize_size=resize)  # 72: resize the short side past 64, then crop
    rng = np.random.default_rng(0)
    for _ in range(3):
        # A 9x9 square blob well inside the part of the image every view keeps (the centre crop).
        cx = rng.uniform(0.4, 0.6) * hw[1]
        cy = rng.uniform(0.4, 0.6) * hw[0]
        img = np.zeros(hw, dtype=np.uint8)
        x0, y0 = int(round(cx)) - 4, int(round(cy)) - 4
        img[y0:y0 + 9, x0:x0 + 9] = 255
        centre = np.array([[x0 + 4.0, y0 + 4.0]])
        frame = view.transform(Image.fromarray(img, mode="L"), spec, Image.Resampling.BILINEAR)
        # Pixel index i covers [i, i+1): compare in continuous coordinates (index + 0.5).
        mapped = view.points(centre + 0.5, hw, spec) - 0.5
        assert np.abs(mapped[0] - _blob_centre(frame)).max() < 1.0, (mapped, _blob_centre(frame))
