"""SIFT keypoints counted by the loader, beside decoding, are the counts the hot loop would make itself: the
thumbnails it counts on are the loader's uint8 pixels bit for bit, on the model's grid and on each image's own
grid (``--keep-aspect``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import pytest
import torch

pytest.importorskip("cv2")

import vitscope
from helpers.mixed_world import stretched_coco
from vitscope.analyses.base import Analysis, Batch, thumbnails
from vitscope.analyses.batch import SIFT_KEYPOINTS
from vitscope.data.open import as_source
from vitscope.data.synthetic.write import synthesize
from vitscope.engine.batches import iter_batches
from vitscope.models.input_size import keeping_aspect
from vitscope.models.preprocess import normalise_pixels, resize_crop, to_pil
from vitscope.models.spec import ModelSpec


class _KeypointProbe(Analysis):
    """Compares, batch by batch, the keypoint counts the loader made with those the hot loop makes without them
    (the same batch, its targets dropped), and the thumbnails with the model's resize and crop of each image."""

    name = "keypoint_probe"

    def __init__(self) -> None:
        super().__init__()
        self.add_state("grids", [], reduce="cat")
        self.add_state("keypoints", 0, reduce="sum")
        self.__dict__["source"] = None

    def required_hooks(self, spec: ModelSpec) -> list[str]:
        return []

    def shared_quantities(self, spec: ModelSpec) -> dict[str, frozenset[str]]:
        return {SIFT_KEYPOINTS: frozenset()}

    def update(self, record: Mapping[str, torch.Tensor], batch: Batch) -> None:
        grid = tuple(batch.grid)
        loaded = batch.targets[SIFT_KEYPOINTS]
        assert len(loaded) == batch.size and all(c.dtype == np.int64 and c.shape == grid for c in loaded)
        used = batch.quantity(SIFT_KEYPOINTS, record)
        assert torch.equal(used, torch.from_numpy(np.stack(loaded)))  # the provider reads the loader's counts
        bare = dataclasses.replace(batch, targets={}, shared=None)  # as under a view: counted here
        assert torch.equal(bare.quantity(SIFT_KEYPOINTS, record), used)
        for i, thumb in zip(batch.indices, thumbnails(batch, range(batch.size))):
            frame = np.asarray(resize_crop(to_pil(self.source.load(i)), batch.spec))
            assert np.array_equal(thumb.numpy(), frame), f"image {i}: the thumbnail is not the loader's pixels"
        self.grids.extend([grid] * batch.size)
        self.keypoints += int(used.sum())

    def compute(self) -> dict:
        return {"grids": [list(g) for g in self.grids], "keypoints": self.keypoints}


def _probe(backbone, data: str, workers: int = 0) -> list[tuple[int, int]]:
    """The token grid of every image of a run of the probe over ``data``."""
    probe = _KeypointProbe()
    probe.__dict__["source"] = as_source(data)
    result = vitscope.run(backbone, data, [probe], batch_size=5, progress=False, workers=workers)["keypoint_probe"]
    assert int(result["keypoints"]) > 0  # the images have corners: the counts say something
    return [tuple(g) for g in result.meta["grids"]]


def test_the_loaders_counts_equal_the_hot_loops_on_the_models_grid(tmp_path) -> None:
    data = f"{synthesize(tmp_path / 'world', 'coco', n=7, size=64, seed=2)}::coco"
    backbone = vitscope.load_model("tiny-vit-sup")
    assert _probe(backbone, data) == [backbone.spec.grid] * 7


def test_the_loaders_counts_equal_the_hot_loops_on_each_images_grid(tmp_path) -> None:
    data = stretched_coco(tmp_path / "mixed", n=6)
    grids = _probe(keeping_aspect(vitscope.load_model("tiny-vit-sup")), data, workers=2)  # counted in workers
    assert len(grids) == 6 and len(set(grids)) > 1  # several grids, groups of one input size


def test_every_uint8_value_comes_back_from_normalised_pixels() -> None:
    """The thumbnail of normalised pixels is the uint8 image they came from, for every value and channel."""
    spec = vitscope.load_model("tiny-vit-sup").spec
    values = torch.arange(256, dtype=torch.uint8).reshape(1, 1, 16, 16).expand(1, 3, 16, 16).contiguous()
    batch = Batch(pixels=normalise_pixels(values, spec), indices=[0], paths=["0"], spec=spec, grid=(2, 2))
    assert torch.equal(thumbnails(batch, [0])[0], values[0].permute(1, 2, 0))


def test_without_uint8_pixels_the_loader_leaves_the_work_to_the_hot_loop() -> None:
    """A backbone's own preprocessing gives normalised pixels: no image work, no target."""
    from vitscope.data.memory import InMemoryImages

    rng = np.random.default_rng(0)
    source = InMemoryImages([rng.integers(0, 256, (16, 16, 3), dtype=np.uint8) for _ in range(2)], labels=[0, 1])
    work = {"seen": lambda image: image.shape}
    as_uint8 = lambda images: torch.stack([torch.from_numpy(np.array(im)).permute(2, 0, 1) for im in images])
    (_, kept), = list(iter_batches(source, 2, preprocess=as_uint8, images=work))
    assert kept.targets["seen"] == [(16, 16, 3)] * 2
    (_, normalised), = list(iter_batches(source, 2, preprocess=lambda images: as_uint8(images).float(), images=work))
    assert "seen" not in normalised.targets
