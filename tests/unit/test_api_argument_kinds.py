"""The public calls take their arguments in every form their docs name: one analysis name as a string (it was read
as a sequence of one-letter names), one comma-separated string of models, a model directory as a ``Path``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import vitscope
from vitscope.errors import VitscopeTypeError, VitscopeValueError
from vitscope.models.checkpoint import save_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


def _images(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for _ in range(n)]


def test_run_takes_one_name_or_a_comma_list_as_a_string() -> None:
    backbone = vitscope.load_model("tiny-vit")
    listed = vitscope.run(backbone, _images(4), ["attention_distance", "attention_stats"], batch_size=2,
                          progress=False, workers=0)
    one = vitscope.run(backbone, _images(4), "attention_distance", batch_size=2, progress=False, workers=0)
    both = vitscope.run(backbone, _images(4), "attention_distance, attention_stats", batch_size=2, progress=False,
                        workers=0)
    assert set(one.results) == {"attention_distance"}
    assert set(both.results) == {"attention_distance", "attention_stats"}
    for name, result in both.results.items():
        for key, tensor in result.tensors.items():
            assert torch.equal(tensor, listed[name].tensors[key]), (name, key)
    for key, tensor in one["attention_distance"].tensors.items():
        assert torch.equal(tensor, listed["attention_distance"].tensors[key]), key


def test_compare_models_reads_one_string_as_the_command_line_does(tmp_path: Path) -> None:
    from vitscope.data.synthetic.write import synthesize

    with pytest.raises(VitscopeValueError) as refused:
        vitscope.compare_models("tiny-vit", _images(4), tmp_path / "one", progress=False, workers=0)
    assert "listed twice" not in str(refused.value) and "two" in str(refused.value)
    data = f"{synthesize(tmp_path / 'coco', 'coco', n=4, size=64, seed=1)}::coco"
    result = vitscope.compare_models("a=tiny-vit,b=tiny-vit-p16", data, tmp_path / "cmp", batch_size=2,
                                     analyses="attention_distance", progress=False, workers=0)
    assert set(result.to_json()["curves"]["attention_distance"]) == {"a", "b"}


def test_a_model_directory_may_be_a_path(tmp_path: Path) -> None:
    saved = vitscope.load_model("tiny-vit")
    save_checkpoint(saved, tmp_path / "ckpt", recipe="none")
    loaded = vitscope.load_model(tmp_path / "ckpt")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), saved(x))
    by_name = vitscope.analyze(str(tmp_path / "ckpt"), _images(4), "attention_distance", batch_size=2,
                               progress=False, workers=0)
    by_path = vitscope.analyze(tmp_path / "ckpt", _images(4), "attention_distance", batch_size=2, progress=False,
                               workers=0)
    expected = by_name["attention_distance"].tensors
    assert expected and by_path["attention_distance"].tensors.keys() == expected.keys()
    for key, tensor in by_path["attention_distance"].tensors.items():
        assert torch.equal(tensor, expected[key]), key


@pytest.mark.parametrize("call", ["load_model", "analyze"])
def test_a_model_that_is_neither_a_name_nor_a_path_is_refused_in_one_line(call: str) -> None:
    with pytest.raises(VitscopeTypeError, match="got int"):
        if call == "load_model":
            vitscope.load_model(3)
        else:
            vitscope.analyze(3, _images(2), "attention_distance", progress=False, workers=0)
