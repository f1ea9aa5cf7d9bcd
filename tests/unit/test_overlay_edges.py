"""Maps over photographs carry no coloured edge strips: every overlay the report and the figure files draw
leaves a grey photo where a map is flat, and no edge is sharper than the inside of the map.

The published jet blend tinted the whole image and drew blue strips where a map was low along the border;
these properties hold for each overlay primitive over grids and images of any size (hypothesis), and the
pictures built on them are checked with a flat map over a grey photo (colour only in their colour bars).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from vitscope.viz.explain_figures import even_share_scale, heat_overlay, signed_overlay
from vitscope.viz.raster import fit_nearest, value_overlay


def _photo(h: int, w: int, seed: int) -> np.ndarray:
    """A smooth photograph (a gradient with a little texture) in colour."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([60 + 120 * yy / max(h - 1, 1), 80 + 100 * xx / max(w - 1, 1), np.full((h, w), 140.0)], -1)
    return np.clip(base + rng.normal(0, 4, base.shape), 0, 255).astype(np.uint8)


def _grey(photo: np.ndarray) -> np.ndarray:
    return np.round(photo.astype(np.float32).mean(-1, keepdims=True).repeat(3, -1)).astype(int)


def _signed(photo: np.ndarray, m: np.ndarray) -> np.ndarray:
    centre, limit = even_share_scale(m)
    return signed_overlay(photo, m, limit, centre)


def _nearest(photo: np.ndarray, m: np.ndarray) -> np.ndarray:  # the rollout pictures' overlay
    top = m.max()
    return value_overlay(photo, fit_nearest(m / top if top > 0 else m, photo.shape[:2]), "inferno")


OVERLAYS = {"signed (paired maps)": _signed,
            "heat (rollout, explain-pair)": lambda p, m: heat_overlay(p, torch.tensor(m)),
            "nearest (rollout pictures)": _nearest}


def _edge_jump(out: np.ndarray, pic: np.ndarray) -> tuple[float, float]:
    """(largest change of the overlay's tint between the outermost row or column and the next one, largest
    change between neighbouring rows or columns inside); the tint is the overlay minus the grey photo."""
    tint = out.astype(np.float32) - _grey(pic)
    rows = np.abs(np.diff(tint, axis=0)).mean(axis=(1, 2))
    cols = np.abs(np.diff(tint, axis=1)).mean(axis=(0, 2))
    edges = max(rows[0], rows[-1], cols[0], cols[-1])
    inside = max(rows[1:-1].max(initial=0.0), cols[1:-1].max(initial=0.0))
    return float(edges), float(inside)


@pytest.mark.parametrize("name", list(OVERLAYS))
@settings(max_examples=25, deadline=None)
@given(grid=st.tuples(st.integers(1, 12), st.integers(1, 12)), size=st.tuples(st.integers(24, 90), st.integers(24, 90)),
       value=st.floats(0.0, 2.0), level=st.integers(0, 255))
def test_a_flat_map_over_a_flat_photo_is_one_colour_to_its_edges(name, grid, size, value, level):
    photo = np.full((*size, 3), level, dtype=np.uint8)
    out = OVERLAYS[name](photo, np.full(grid, value, dtype=np.float32)).astype(int)
    assert out.shape == photo.shape
    assert np.abs(out - out[size[0] // 2, size[1] // 2]).max() <= 1  # one colour everywhere, edges included
    if not name.startswith("nearest"):  # min-max and signed maps: flat is no signal, the photo stays grey
        assert np.abs(out - level).max() <= 1


@pytest.mark.parametrize("name", list(OVERLAYS))
@settings(max_examples=25, deadline=None)
@given(grid=st.tuples(st.integers(3, 12), st.integers(3, 12)), size=st.tuples(st.integers(40, 90), st.integers(40, 90)),
       seed=st.integers(0, 2**16))
def test_no_edge_is_sharper_than_the_inside_of_the_map(name, grid, size, seed):
    rng = np.random.default_rng(seed)
    m = rng.normal(0.0, 1.0, grid).astype(np.float32)
    if name.startswith("nearest") or name.startswith("heat"):
        m = np.abs(m)  # rollout maps are not negative
    photo = _photo(*size, seed)
    edges, inside = _edge_jump(OVERLAYS[name](photo, m), photo)
    assert edges <= inside + 1.0, f"an edge changes by {edges:.1f} levels, the inside at most by {inside:.1f}"


def _coloured_rows(path) -> np.ndarray:
    """Rows of a picture that hold coloured pixels (channels apart by more than 40 levels: the labels' ink is
    a bluish grey)."""
    arr = np.asarray(Image.open(path).convert("RGB")).astype(int)
    return np.nonzero((arr.max(-1) - arr.min(-1) > 40).any(axis=1))[0]


def test_rollout_and_top_activation_pictures_colour_only_their_colour_bars(tmp_path):
    from vitscope.viz.attention_maps import rollout_figure
    from vitscope.viz.featviz_figures import top_activation_grid

    grey = np.full((40, 40, 3), 128, dtype=np.uint8)
    flat = np.zeros((2, 7, 7), dtype=np.float32)  # rollout pictures scale by the maximum: 0 is no attention
    rollout = rollout_figure(np.stack([grey, grey]), flat, ["a.jpg", "b.jpg"], flat[0], None, "rollout",
                             tmp_path / "rollout")[0]
    rows = _coloured_rows(rollout)
    assert rows.size and rows.min() > 56 + 180, f"coloured rows {rows.min()}..: above the colour bar"
    grid = top_activation_grid(torch.full((2, 3, 5, 5), 0.7), torch.ones(2, 3), ["u0", "u1"],
                               [[torch.from_numpy(grey)] * 3] * 2, "blocks.0.mlp", tmp_path / "top")[0]
    rows = _coloured_rows(grid)
    assert rows.size and rows.min() > 34 + 2 * (96 + 24), f"coloured rows {rows.min()}..: above the colour bar"
