"""SIFT keypoints counted per patch (docs/methods.md, SIFT patch interrelation)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

cv2 = pytest.importorskip("cv2")

from vitscope.functional import sift_keypoint_counts  # noqa: E402
from vitscope.functional.sift import sift_keypoints  # noqa: E402


def _textured(size: tuple[int, int], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    img = np.full((*size, 3), 40, dtype=np.uint8)
    for _ in range(12):
        y, x = rng.integers(0, size[0] - 8), rng.integers(0, size[1] - 8)
        img[y:y + rng.integers(3, 9), x:x + rng.integers(3, 9)] = rng.integers(120, 255, 3)
    return img


@pytest.mark.parametrize(("size", "grid"), [((64, 64), (8, 8)), ((60, 75), (7, 5))])
def test_counts_follow_the_patch_rule(size, grid) -> None:
    img = _textured(size)
    gray = cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)
    pts = [kp.pt for kp in cv2.SIFT_create().detect(gray, None)]
    assert pts, "the textured image should have keypoints"
    want = torch.zeros(grid, dtype=torch.int64)
    ph, pw = size[0] / grid[0], size[1] / grid[1]
    for x, y in pts:
        want[min(math.floor(y / ph), grid[0] - 1), min(math.floor(x / pw), grid[1] - 1)] += 1
    got = sift_keypoint_counts(img, grid)
    assert got.dtype == torch.int64 and tuple(got.shape) == grid
    assert torch.equal(got, want)
    assert int(got.sum()) == len(sift_keypoints(img))


def test_flat_image_has_no_keypoints_and_bad_input_raises() -> None:
    assert int(sift_keypoint_counts(np.full((32, 32, 3), 128, np.uint8), (4, 4)).sum()) == 0
    with pytest.raises(ValueError, match="uint8"):
        sift_keypoint_counts(np.zeros((32, 32, 3), np.float32), (4, 4))
    with pytest.raises(ValueError, match="grid"):
        sift_keypoint_counts(np.zeros((32, 32, 3), np.uint8), (0, 4))
