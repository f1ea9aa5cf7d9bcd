"""The spatial-information test of paper 001 appendix F."""

from __future__ import annotations

import pytest
import torch

import vitscope
from vitscope.featviz.spatial import linearity, spatial_information, spatial_information_by_block, unit_maps
from vitscope.train.data import synthetic_split


@pytest.fixture(scope="module")
def setup():
    return vitscope.load_model("tiny-vit-sup"), synthetic_split(40, seed=2, size=64).images


def test_linearity() -> None:
    x = torch.linspace(0, 1, 6, dtype=torch.float64)
    assert linearity(x, 1 - x) == pytest.approx({"r2": 1.0, "slope": -1.0, "gap_to_identity": 0.0}, abs=1e-9)
    flat = linearity(x, torch.ones(6))
    assert flat["slope"] == pytest.approx(0.0) and flat["gap_to_identity"] == pytest.approx(0.5)


def test_reference_is_one_and_removing_everything_of_a_local_site_empties_it(setup) -> None:
    tiny, images = setup
    # the patch embedding is local: a black patch's token is the same everywhere up to position,
    # so pick a threshold above every black-patch value -> removing all active patches leaves none active
    black = unit_maps(tiny, "embed", 3, torch.zeros(1, 3, 64, 64))
    maps = unit_maps(tiny, "embed", 3, images)
    thr = float(max(black.max(), maps.quantile(0.7)))
    curve = spatial_information(tiny, "embed", 3, images[:6], fractions=(0.0, 0.5, 1.0), threshold=thr)
    assert curve.images_used > 0
    assert curve.count_ratio[0] == 1.0 and curve.sum_ratio[0] == 1.0
    assert curve.count_ratio[-1] == 0.0
    # local site: exactly the kept half of the active patches stays active
    assert 0.3 < float(curve.count_ratio[1]) < 0.7


def test_by_block_shapes_and_determinism(setup) -> None:
    tiny, images = setup
    a = spatial_information_by_block(tiny, images, channels=[0, 5], blocks=[1, 5], k=2,
                                     fractions=(0.0, 0.5, 1.0), threshold=0.2)
    b = spatial_information_by_block(tiny, images, channels=[0, 5], blocks=[1, 5], k=2,
                                     fractions=(0.0, 0.5, 1.0), threshold=0.2)
    assert a["count_ratio"].shape == (2, 3) and a["blocks"] == [1, 5]
    torch.testing.assert_close(a["count_ratio"], b["count_ratio"], equal_nan=True)
    used = a["units_used"] > 0
    assert (a["count_ratio"][used, 0] == 1.0).all()
