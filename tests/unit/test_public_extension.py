"""A new analysis written outside the package, through the public API only: one class, registered where it is
defined; merge, reset, state_dict and resume come from the base class (the documented example, as written)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import vitscope


def _token_norm_class():
    @vitscope.register_analysis("token_norm")
    class TokenNorm(vitscope.Analysis):
        def __init__(self):
            super().__init__()
            self.add_state("total", torch.zeros((), dtype=torch.float64), reduce="sum")
            self.add_state("count", torch.zeros((), dtype=torch.float64), reduce="sum")
            self.add_state("peak", torch.zeros((), dtype=torch.float64), reduce="max")

        def required_hooks(self, spec):
            return ["blocks.0.resid_post"]

        def update(self, record, batch):
            n = record["blocks.0.resid_post"].double().norm(dim=-1)
            self.total += n.sum(); self.count += n.numel(); self.peak = torch.maximum(self.peak, n.max())  # noqa: E702

        def compute(self):  # a plain dict is wrapped into a result by the engine
            return {"mean_norm": self.total / self.count, "peak": self.peak}

    return TokenNorm


def _images(n: int = 11) -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (40 + i, 52, 3), dtype=np.uint8)) for i in range(n)]


def test_the_documented_example_runs_and_merges_without_code_of_its_own(clean_registry) -> None:
    TokenNorm = _token_norm_class()
    backbone = vitscope.load_model("tiny-vit")
    images = _images()
    results = vitscope.run(backbone, images, [TokenNorm()], batch_size=8, device="cpu", progress=False)
    mean_norm = float(results["token_norm"]["mean_norm"])
    with torch.no_grad(), backbone.record("blocks.0.resid_post") as rec:  # by hand, on all images at once
        backbone(backbone.preprocess(images))
        norms = rec["blocks.0.resid_post"].double().norm(dim=-1)
    assert mean_norm == pytest.approx(float(norms.mean()), rel=1e-9)
    assert float(results["token_norm"]["peak"]) == pytest.approx(float(norms.max()), rel=1e-12)
    assert "token_norm" in vitscope.analyses.ANALYSES  # registered where it is defined

    a, b = TokenNorm(), TokenNorm()
    vitscope.run(backbone, images[:5], [a], batch_size=8, device="cpu", progress=False)
    vitscope.run(backbone, images[5:], [b], batch_size=8, device="cpu", progress=False)
    merged = a.fresh()
    merged.load_state_dict(a.state_dict())
    merged.merge(b)
    assert float(merged.total / merged.count) == pytest.approx(mean_norm, rel=1e-12)
    assert float(merged.peak) == float(results["token_norm"]["peak"])
    a.reset()
    assert float(a.count) == 0.0


def test_a_list_of_images_resumes_by_its_pixels(clean_registry, tmp_path, monkeypatch) -> None:
    TokenNorm = _token_norm_class()
    backbone = vitscope.load_model("tiny-vit")
    images = _images()
    state = tmp_path / "state.pt"
    whole = vitscope.run(backbone, images, [TokenNorm()], batch_size=4, device="cpu", progress=False)
    monkeypatch.setenv("VITSCOPE_STOP_AFTER_BATCHES", "1")
    with pytest.raises(KeyboardInterrupt):
        vitscope.run(backbone, images, [TokenNorm()], batch_size=4, device="cpu", progress=False, resume=state)
    monkeypatch.delenv("VITSCOPE_STOP_AFTER_BATCHES")
    resumed = vitscope.run(backbone, images, [TokenNorm()], batch_size=4, device="cpu", progress=False, resume=state)
    assert resumed.resumed_images == 4 and resumed.num_images == len(images)
    torch.testing.assert_close(resumed["token_norm"]["mean_norm"], whole["token_norm"]["mean_norm"], rtol=0, atol=0)
    assert resumed.data["fingerprint"]["method"].startswith("content")
    other = [im.transpose(Image.Transpose.FLIP_LEFT_RIGHT) for im in images]  # other pixels: starts over
    again = vitscope.run(backbone, other, [TokenNorm()], batch_size=4, device="cpu", progress=False, resume=state)
    assert again.resumed_images == 0
