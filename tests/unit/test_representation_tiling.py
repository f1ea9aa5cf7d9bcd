"""Dense features by tiling (paper 002 appendix B.4): the plan, the stitching, and the tiled view."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import vitscope
from vitscope.functional.tiling import stitch_tiles, tiling_plan
from vitscope.models.views import StandardView, TiledView, normalise


def test_plan_without_remainder() -> None:
    # short side 100 -> 2 * 32 = 64; long side 150 * 64 / 100 = 96 (a multiple of 8): 2 x 3 tiles
    plan = tiling_plan((100, 150), (32, 32), 8)
    assert plan.resized == (64, 96) and plan.grid == (8, 12)
    assert plan.origins == ((0, 0), (0, 32), (0, 64), (32, 0), (32, 32), (32, 64))


def test_plan_floors_the_long_side_and_shifts_the_last_tile_back() -> None:
    # portrait: width is the short side; height 170 * 64 / 100 = 108.8 -> floored to 104
    plan = tiling_plan((170, 100), (32, 32), 8)
    assert plan.resized == (104, 64) and plan.grid == (13, 8)
    tops = sorted({t for t, _ in plan.origins})
    assert tops == [0, 32, 64, 72]  # the last tile ends at the edge (104 - 32 = 72)
    assert len(plan.origins) == 4 * 2


def test_plan_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="multiple of the patch"):
        tiling_plan((64, 64), (30, 30), 8)
    with pytest.raises(ValueError, match="scale must be >= 1"):
        tiling_plan((64, 64), (32, 32), 8, scale=0.5)


def test_stitch_first_write_wins() -> None:
    plan = tiling_plan((170, 100), (32, 32), 8)  # tops 0, 32, 64, 72; lefts 0, 32
    tiles = torch.stack([torch.full((1, 4, 4), float(k)) for k in range(len(plan.origins))])
    dense = stitch_tiles(tiles, plan)[0]
    assert dense.shape == (13, 8)
    # token rows 9..11 were covered by the tiles at top 64 (numbers 4, 5); only row 12 comes from top 72 (6, 7)
    assert dense[9:12, :4].eq(4).all() and dense[9:12, 4:].eq(5).all()
    assert dense[12, :4].eq(6).all() and dense[12, 4:].eq(7).all()
    assert dense[0, 0] == 0 and dense[4, 7] == 3
    with pytest.raises(ValueError, match="tiles must be"):
        stitch_tiles(tiles[:3], plan)


def test_tiled_view_tokens_are_the_tiles_tokens() -> None:
    """On a 64 px model, a 40 x 60 image becomes 128 x 192: six tiles whose own forwards give the dense grid."""
    backbone = vitscope.load_model("tiny-vit")
    spec = backbone.spec
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 255, (40, 60, 3), dtype=np.uint8))
    hook = "blocks.2.resid_post"
    with torch.inference_mode(), backbone.record([hook]) as rec:

        def forward(pixels: torch.Tensor, positions) -> dict[str, torch.Tensor]:
            assert list(positions) == [0] * len(pixels)  # every tile is the one image's
            backbone(pixels)
            return {hook: rec[hook].clone()}

        view = TiledView()
        (group,) = view.tokens([image], spec, forward)
        assert group.num_prefix == 0 and group.grid == (16, 24) and group.frame_hw == (128, 192)
        big = view.transform(image, spec)
        tile = big.crop((64, 64, 128, 128))  # the tile at row 1, column 1
        direct = forward(normalise([tile], spec), [0])[hook][0, 1:]  # [64, D] spatial tokens
    dense = group.tokens[hook][0].reshape(16, 24, -1)
    torch.testing.assert_close(dense[8:16, 8:16].reshape(64, -1), direct)


def test_mask_frame_follows_the_view_geometry() -> None:
    spec = vitscope.load_model("tiny-vit").spec
    mask = np.zeros((1, 40, 60), dtype=bool)
    mask[0, :, 30:] = True  # right half
    tiled = TiledView().mask_frame(mask, spec)
    assert tiled.shape == (1, 128, 192)
    assert tiled[0, :, :90].max() < 0.5 and tiled[0, :, 100:].min() > 0.5
    standard = StandardView().mask_frame(mask, spec)  # centre crop of the 64 x 96 resize: columns 16..80
    assert standard.shape == (1, 64, 64)
    assert standard[0, :, :28].max() < 0.5 and standard[0, :, 36:].min() > 0.5
