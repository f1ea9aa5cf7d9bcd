"""Noisy linear imputation (ROAD) on cases whose answer is known: constants and linear ramps are filled exactly,
known pixels never move, and the noise is seeded."""

from __future__ import annotations

import pytest
import torch

from vitscope.errors import VitscopeValueError
from vitscope.functional.imputation import noisy_linear_imputation


def test_a_linear_ramp_is_filled_exactly_and_known_pixels_stay():
    """The weighted mean of a pixel's 8 neighbours is symmetric, so a linear function satisfies the equations."""
    h, w = 9, 11
    yy, xx = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64),
                            indexing="ij")
    ramp = torch.stack([2 * yy - xx, 0.5 * xx + 3, torch.full_like(xx, 7.0)])[None]  # [1, 3, H, W]
    removed = torch.zeros(1, h, w, dtype=torch.bool)
    removed[0, 2:7, 3:9] = True  # an interior block
    filled = noisy_linear_imputation(ramp, removed, noise=0.0)
    torch.testing.assert_close(filled, ramp, atol=1e-9, rtol=0)
    damaged = ramp.clone()
    damaged[0, :, 2:7, 3:9] = 100.0  # what was there is never read
    torch.testing.assert_close(noisy_linear_imputation(damaged, removed, noise=0.0), ramp, atol=1e-9, rtol=0)


def test_a_pixel_amid_a_constant_is_the_constant_and_noise_is_seeded():
    image = torch.full((2, 1, 4, 4), 0.25)
    removed = torch.zeros(2, 4, 4, dtype=torch.bool)
    removed[:, 0, 0] = True  # a corner: its three neighbours, renormalised
    removed[1, 1:3, 1:3] = True
    torch.testing.assert_close(noisy_linear_imputation(image, removed, noise=0.0), image)
    a = noisy_linear_imputation(image, removed, noise=0.01, generator=torch.Generator().manual_seed(1))
    b = noisy_linear_imputation(image, removed, noise=0.01, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and torch.equal(a[~removed[:, None].expand_as(a)], image[~removed[:, None].expand_as(a)])
    assert 0 < float((a - image).abs().max()) < 0.1
    everything = torch.ones(1, 4, 4, dtype=torch.bool)
    assert float(noisy_linear_imputation(image[:1], everything, noise=0.0).abs().max()) == 0.0  # nothing known
    with pytest.raises(VitscopeValueError, match="removed"):
        noisy_linear_imputation(image, removed[:, :2])
