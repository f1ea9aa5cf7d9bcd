"""Inside ``vitscope.run`` an edit knows the dataset indices of the images each forward runs on, under every view
(regrouped frame sizes, tiles) and in an analysis's own reruns, so resampling never depends on the batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vitscope
from vitscope.analyses.base import Analysis
from vitscope.hooks.edits import images_running, running_images, tiles_running
from vitscope.interventions import ablate_tokens
from vitscope.models.views import FrameView, TiledView

# two frame sizes, interleaved: a frame view runs images 0, 2, 4 together and 1, 3 together
SIZES = [(32, 32), (32, 64), (32, 32), (32, 64), (32, 32)]


def images() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in SIZES]


class Reruns(Analysis):
    """Runs the model again on the batch's pixels and keeps which images its edits were told they see."""

    name = "reruns"

    def __init__(self) -> None:
        super().__init__()
        self.told: list[tuple[list[int], tuple[int, ...] | None]] = []

    def required_hooks(self, spec):
        return ["blocks.0.resid_post"]

    def update(self, record, batch):
        self.told.append((list(batch.indices), batch.model.run(lambda b: images_running())))

    def compute(self):
        return {}


@pytest.mark.parametrize("view", [None, FrameView(short_side=32, multiple=32), TiledView(scale=1.0)],
                         ids=["own", "frames", "tiles"])
def test_each_forward_and_each_rerun_is_told_its_images(view) -> None:
    backbone = vitscope.load_model("tiny-vit")
    forwards: list[tuple[tuple[int, ...] | None, int]] = []

    def watch(t: torch.Tensor, name: str) -> torch.Tensor:
        forwards.append((images_running(), t.shape[0]))
        return t

    reruns = Reruns()
    data = images() if view is not None else [np.zeros((32, 32, 3), dtype=np.uint8)] * 5
    with backbone.intervene({"embed": watch}):
        vitscope.run(backbone, data, [reruns], batch_size=5, view=view, progress=False, workers=0)
    assert reruns.told and all(tuple(indices) == told for indices, told in reruns.told)
    if view is None:  # the reruns run no forward: these are the pass's
        assert forwards == [((0, 1, 2, 3, 4), 5)]
    elif isinstance(view, FrameView):
        assert sorted(forwards) == [((0, 2, 4), 3), ((1, 3), 2)]
    else:  # each image's tiles: one tile for a square image, two for a wide one at scale 1
        assert forwards == [((0,), 1), ((1, 1), 2), ((2,), 1), ((3, 3), 2), ((4,), 1)]


class Keep(Analysis):
    """Keeps every image's tokens after block 1, by dataset index."""

    name = "keep"

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[int, torch.Tensor] = {}

    def required_hooks(self, spec):
        return ["blocks.1.resid_post"]

    def update(self, record, batch):
        for j, i in enumerate(batch.indices):
            self.rows[int(i)] = record["blocks.1.resid_post"][j].clone()

    def compute(self):
        return {}


def test_resampled_token_ablation_under_a_view_does_not_depend_on_the_batch() -> None:
    """Each image takes reference image (i + 1) mod R, whatever the batch and the grouping by frame size."""
    backbone = vitscope.load_model("tiny-vit")
    view = FrameView(short_side=32, multiple=32)
    h, w = backbone.spec.grid_for(32, 32)
    tokens = backbone.spec.num_prefix_tokens + h * w
    reference = {"blocks.1.resid_pre": torch.randn(3, tokens, backbone.spec.embed_dim,
                                                    generator=torch.Generator().manual_seed(0))}
    data = [im for im in images() if im.shape[1] == 32]  # one frame size: the reference's token count
    rows = []
    for batch_size in (1, 2, 3):
        keep = Keep()
        with backbone.intervene(ablate_tokens([1, 2], "resample", hooks=["blocks.1.resid_pre"], reference=reference)):
            vitscope.run(backbone, data, [keep], batch_size=batch_size, view=view, progress=False, workers=0)
        rows.append(torch.stack([keep.rows[i] for i in range(len(data))]))
    # image i's token 1 before block 1 is reference image (i + 1) mod 3's
    for i in range(len(data)):
        unedited = Keep()
        vitscope.run(backbone, [data[i]], [unedited], view=view, progress=False, workers=0)
        assert not torch.allclose(rows[0][i], unedited.rows[0])
    torch.testing.assert_close(rows[0], rows[1], rtol=0, atol=1e-6)
    torch.testing.assert_close(rows[0], rows[2], rtol=0, atol=1e-6)


def test_tiles_of_one_image_are_told_apart_and_draw_their_own_noise() -> None:
    """A tiled view tells each row its tile; noise ablation seeds each tile by (image, tile), so two tiles of one
    image never share their noise, and an image's tiles draw the same noise at any batch size."""
    backbone = vitscope.load_model("tiny-vit")
    told: list[tuple[int, ...] | None] = []

    def watch(t: torch.Tensor, name: str) -> torch.Tensor:
        told.append(tiles_running())
        return t

    data = images()
    with backbone.intervene({"embed": watch}):
        vitscope.run(backbone, data, [Keep()], batch_size=5, view=TiledView(scale=1.0), progress=False, workers=0)
    assert told == [(0,), (0, 1), (0,), (0, 1), (0,)]

    name = "blocks.1.resid_pre"
    reference = {name: torch.randn(4, 5, 8, generator=torch.Generator().manual_seed(1))}
    edit = ablate_tokens([1, 2], "noise", hooks=[name], reference=reference, seed=3)[name]
    same = torch.zeros(2, 5, 8)  # two tiles whose tokens are equal: only the draws can tell them apart
    with running_images([7, 7], [0, 1]):
        tiled = edit(same, name)
    with running_images([7, 7]):
        untiled = edit(same, name)
    assert not torch.allclose(tiled[0, 1:3], tiled[1, 1:3])
    torch.testing.assert_close(untiled[0], untiled[1], rtol=0, atol=0)  # one image told twice: one draw
    torch.testing.assert_close(tiled[0], untiled[0], rtol=0, atol=0)  # tile 0 draws as the whole image does
