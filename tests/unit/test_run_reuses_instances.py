"""An analysis instance given to a second ``vitscope.run`` starts afresh: it held the first run's state (whole, or
partial after a failure) and added the second run's to it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vitscope
from vitscope.analyses.base import Analysis
from vitscope.analyses.registry import get_analysis

NAMES = ["attention_stats", "top_activations", "cka"]


class _StopsAtSecondBatch(Analysis):
    name = "stops_at_second_batch"

    def __init__(self) -> None:
        super().__init__()
        self.batches = 0

    def required_hooks(self, spec):
        return ["blocks.0.attn.pattern"]

    def update(self, record, batch):
        self.batches += 1
        if self.batches == 2:
            raise RuntimeError("stopped at the second batch")

    def compute(self):
        return None


def _images(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for _ in range(n)]


def _equal(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


@pytest.mark.parametrize("first_fails", [False, True])
def test_a_second_run_of_the_same_instances_equals_a_fresh_one(first_fails: bool) -> None:
    backbone = vitscope.load_model("tiny-vit")
    used = [get_analysis(n) for n in NAMES]
    first = _images(6, seed=1)
    if first_fails:  # the pass stops half-way: the instances hold a partial state
        with pytest.raises(RuntimeError, match="stopped at the second batch"):
            vitscope.run(backbone, first, [*used, _StopsAtSecondBatch()], batch_size=2, progress=False, workers=0)
    else:
        vitscope.run(backbone, first, used, batch_size=2, progress=False, workers=0)
    second = _images(4, seed=2)
    again = vitscope.run(backbone, second, used, batch_size=2, progress=False, workers=0)
    fresh = vitscope.run(backbone, second, NAMES, batch_size=2, progress=False, workers=0)
    for name in NAMES:
        assert _equal(again[name].tensors, fresh[name].tensors), name


@pytest.mark.parametrize("image", [np.zeros((0, 0, 3), dtype=np.uint8), np.zeros((5, 0, 3), dtype=np.uint8)])
def test_an_empty_image_in_memory_is_refused_in_one_line(image) -> None:
    """An empty array reached the resize, which divided by its size (a ZeroDivisionError from the engine)."""
    from PIL import Image

    from vitscope.errors import VitscopeValueError

    backbone = vitscope.load_model("tiny-vit")
    for empty in (image, Image.fromarray(image)):
        with pytest.raises(VitscopeValueError, match=r"image 1 is empty \(\d+ x 0 pixels\)"):
            vitscope.run(backbone, [_images(1, seed=0)[0], empty], ["attention_stats"], progress=False, workers=0)
