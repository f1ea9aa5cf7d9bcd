"""Batched augmentations: shapes, seeds, and the cases whose output is known exactly."""

import pytest
import torch

from vitscope.train.augment import (
    color_jitter,
    foreground_points,
    gaussian_blur,
    grayscale,
    random_erasing,
    random_resized_crop,
    rotate_hue,
    solarize,
    swap_background,
)


def _images(b=4, s=16):
    return torch.rand(b, 3, s, s, generator=torch.Generator().manual_seed(0))


def test_full_crop_without_flip_is_identity():
    x = _images()
    y = random_resized_crop(x, 16, (1.0, 1.0), torch.Generator().manual_seed(1), ratio=(1.0, 1.0), flip=0.0)
    assert torch.allclose(y, x, atol=1e-5)


def test_full_crop_with_certain_flip_mirrors():
    x = _images()
    y = random_resized_crop(x, 16, (1.0, 1.0), torch.Generator().manual_seed(1), ratio=(1.0, 1.0), flip=1.0)
    assert torch.allclose(y, x.flip(-1), atol=1e-5)


def test_crop_resizes_and_repeats_for_a_seed():
    x = _images()
    a = random_resized_crop(x, 8, (0.1, 0.5), torch.Generator().manual_seed(3))
    b = random_resized_crop(x, 8, (0.1, 0.5), torch.Generator().manual_seed(3))
    c = random_resized_crop(x, 8, (0.1, 0.5), torch.Generator().manual_seed(4))
    assert a.shape == (4, 3, 8, 8) and torch.equal(a, b) and not torch.equal(a, c)


def test_small_crop_of_a_half_coloured_image_sees_less_variety():
    x = torch.zeros(64, 3, 32, 32)
    x[..., 16:] = 1.0  # left half black, right half white
    small = random_resized_crop(x, 8, (0.02, 0.02), torch.Generator().manual_seed(0), flip=0.0)
    # a crop of 2% of the area lies mostly on one side: most crops are nearly constant
    spread = small.amax(dim=(1, 2, 3)) - small.amin(dim=(1, 2, 3))
    assert (spread < 0.5).float().mean() > 0.6


def test_grayscale_certain_gives_equal_channels_and_never_keeps_input():
    x = _images()
    y = grayscale(x, torch.Generator().manual_seed(0), p=1.0)
    assert torch.allclose(y[:, 0], y[:, 1]) and torch.allclose(y[:, 1], y[:, 2])
    assert torch.equal(grayscale(x, torch.Generator().manual_seed(0), p=0.0), x)


def test_color_jitter_without_strength_is_identity_and_stays_in_range():
    x = _images()
    same = color_jitter(x, torch.Generator().manual_seed(0), brightness=0.0, contrast=0.0, saturation=0.0, p=1.0)
    assert torch.allclose(same, x, atol=1e-6)
    y = color_jitter(x, torch.Generator().manual_seed(0), p=1.0)
    assert y.min() >= 0 and y.max() <= 1 and not torch.allclose(y, x)


def test_hue_rotation_keeps_luma_and_turns_red_towards_green():
    red = torch.zeros(1, 3, 2, 2)
    red[:, 0] = 0.5
    red[:, 1:] = 0.25
    turned = rotate_hue(red, torch.tensor([-2.0]))  # in gamut: nothing clamped
    luma = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)
    assert torch.allclose((turned * luma).sum(1), (red * luma).sum(1), atol=1e-5)
    assert turned[0, 1, 0, 0] > turned[0, 0, 0, 0]  # green now above red
    assert torch.allclose(rotate_hue(red, torch.tensor([0.0])), red, atol=1e-6)


def test_hue_jitter_is_off_by_default_without_drawing_numbers():
    x = _images()
    plain = color_jitter(x, torch.Generator().manual_seed(3), p=1.0)
    explicit = color_jitter(x, torch.Generator().manual_seed(3), p=1.0, hue=0.0)
    assert torch.equal(plain, explicit)  # same random stream as before the hue option existed
    assert not torch.allclose(color_jitter(x, torch.Generator().manual_seed(3), p=1.0, hue=0.5), plain)


def test_blur_keeps_constants_and_smooths_noise():
    const = torch.full((2, 3, 16, 16), 0.3)
    assert torch.allclose(gaussian_blur(const, torch.Generator().manual_seed(0), p=1.0), const, atol=1e-6)
    x = _images()
    y = gaussian_blur(x, torch.Generator().manual_seed(0), p=1.0, sigma=(1.0, 1.0))
    assert y.std() < 0.6 * x.std()


def test_solarize_inverts_bright_pixels_only():
    x = torch.tensor([0.2, 0.6]).view(1, 1, 1, 2).expand(1, 3, 1, 2)
    y = solarize(x, torch.Generator().manual_seed(0), p=1.0)
    assert torch.allclose(y[0, 0, 0], torch.tensor([0.2, 0.4]))


def test_random_erasing_replaces_one_box_per_erased_image():
    x = torch.full((64, 3, 32, 32), 0.5)
    y = random_erasing(x, torch.Generator().manual_seed(0), p=0.5, scale=(0.05, 0.2))
    changed = (y != x).any(1)  # [B, H, W]
    erased = changed.flatten(1).any(1)
    assert 16 < int(erased.sum()) < 48  # about half of the images
    for img in changed[erased]:
        rows, cols = img.any(1).nonzero().flatten(), img.any(0).nonzero().flatten()
        box = img[rows.min():rows.max() + 1, cols.min():cols.max() + 1]
        assert box.float().mean() > 0.95  # one rectangle (noise may equal 0.5 at a few pixels)
        assert 0.02 <= box.numel() / img.numel() <= 0.3
    assert (y >= 0).all() and (y <= 1).all()
    assert torch.equal(y, random_erasing(x, torch.Generator().manual_seed(0), p=0.5, scale=(0.05, 0.2)))


def test_random_erasing_off_leaves_images_alone():
    x = torch.rand(4, 3, 16, 16)
    assert torch.equal(random_erasing(x, torch.Generator().manual_seed(1), p=0.0), x)


def _constant_batch(b=3, s=8):
    """Image i is the constant (i + 1) / 10; its foreground is the left half."""
    x = torch.arange(1, b + 1, dtype=torch.float32).div(10).view(b, 1, 1, 1).expand(b, 3, s, s).clone()
    fg = torch.zeros(b, s, s, dtype=torch.bool)
    fg[:, :, : s // 2] = True
    return x, fg


def test_swap_background_keeps_objects_and_takes_another_images_background():
    x, fg = _constant_batch()
    y = swap_background(x, fg, torch.Generator().manual_seed(0), p=1.0)
    assert torch.equal(y[:, :, :, :4], x[:, :, :, :4])  # objects untouched
    backgrounds = y[:, 0, 0, -1]
    assert all(backgrounds[i] != x[i, 0, 0, 0] for i in range(3))  # never its own background
    assert sorted(backgrounds.tolist()) == pytest.approx(sorted(x[:, 0, 0, 0].tolist()))  # a permutation
    assert torch.equal(y[:, :, :, 4:], backgrounds.view(3, 1, 1, 1).expand(3, 3, 8, 4))


def test_swap_background_off_single_image_and_bad_masks():
    x, fg = _constant_batch()
    assert torch.equal(swap_background(x, fg, torch.Generator().manual_seed(0), p=0.0), x)
    assert torch.equal(swap_background(x[:1], fg[:1], torch.Generator().manual_seed(0)), x[:1])
    with pytest.raises(ValueError, match="foreground must be"):
        swap_background(x, fg[:, :4], torch.Generator())


def test_foreground_points_fall_on_object_pixels_and_are_nan_without_one():
    fg = torch.zeros(3, 8, 8, dtype=torch.bool)
    fg[0, 6, 1] = True  # row 6, column 1: centre ((2 * 1 + 1) / 8 - 1, (2 * 6 + 1) / 8 - 1)
    fg[1, :, 5:] = True
    points = foreground_points(fg, torch.Generator().manual_seed(0))
    assert points[0].tolist() == pytest.approx([-0.625, 0.625])
    assert points[1, 0] > 0.25  # column >= 5
    assert points[2].isnan().all()  # no object: the crop is placed at random
    many = foreground_points(fg[1:2].expand(400, 8, 8).float(), torch.Generator().manual_seed(1))
    assert sorted(set(many[:, 0].tolist())) == pytest.approx([0.375, 0.625, 0.875])  # columns 5, 6, 7 only
    assert many[:, 1].min() == pytest.approx(-0.875) and many[:, 1].max() == pytest.approx(0.875)  # every row
    with pytest.raises(ValueError, match=r"\[B, H, W\]"):
        foreground_points(fg[0], torch.Generator())


def test_crop_centred_on_a_point_samples_around_it_and_stays_inside():
    x = torch.zeros(2, 3, 8, 8)
    x[0, :, 6, 1] = 1.0
    x[1] = torch.arange(64.0).view(8, 8)
    centre = torch.tensor([[-0.625, 0.625], [float("nan"), float("nan")]])
    # a one-pixel box on pixel (6, 1), read at 2 x 2 points a quarter pixel from its centre: 0.75 * 0.75 each
    y = random_resized_crop(x, 2, (1 / 64, 1 / 64), torch.Generator().manual_seed(0), ratio=(1.0, 1.0), flip=0.0,
                            centre=centre)
    assert torch.allclose(y[0], torch.full((3, 2, 2), 0.5625))
    plain = random_resized_crop(x, 2, (1 / 64, 1 / 64), torch.Generator().manual_seed(0), ratio=(1.0, 1.0), flip=0.0)
    assert torch.equal(y[1], plain[1])  # a NaN row keeps the random centre
    assert not torch.equal(y[0], plain[0])
    nan = torch.full((2, 2), float("nan"))  # all-NaN centres leave every random draw as without them
    assert torch.equal(random_resized_crop(x, 4, (0.1, 0.5), torch.Generator().manual_seed(5), centre=nan),
                       random_resized_crop(x, 4, (0.1, 0.5), torch.Generator().manual_seed(5)))
    corner = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])  # a half-image box cannot be centred on the corner
    z = random_resized_crop(torch.arange(64.0).view(1, 1, 8, 8).expand(2, 3, 8, 8).contiguous(), 4, (0.25, 0.25),
                            torch.Generator().manual_seed(0), ratio=(1.0, 1.0), flip=0.0, centre=corner)
    grid = torch.arange(64.0).view(8, 8)
    assert torch.allclose(z[0, 0], grid[4:, 4:]) and torch.allclose(z[1, 0], grid[:4, :4])  # moved inside
