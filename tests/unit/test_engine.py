"""vitscope.run: one pass, union of hooks, results by name, batch independence, bad images, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vitscope
from helpers.images import random_pngs
from vitscope.analyses import AttentionStats, MeanActivation
from vitscope.data.files import ImageFiles
from vitscope.data.images import EmptyDatasetError, ImageLoadError
from vitscope.functional.attention_stats import attention_entropy


@pytest.fixture(scope="module")
def tiny():
    return vitscope.load_model("tiny-vit")


@pytest.fixture
def folder(tmp_path):
    return random_pngs(tmp_path, [(48 + 8 * i, 64) for i in range(5)])


def test_results_by_name_and_equal_to_direct_computation(tiny, folder):
    res = vitscope.run(tiny, str(folder), [AttentionStats(), MeanActivation()], batch_size=2, progress=False)
    assert set(res) == {"attention_stats", "mean_activation"} and res.num_images == 5
    assert "blocks.0.attn.pattern" in res.hooks and "blocks.5.resid_post" in res.hooks
    ds = ImageFiles(folder)
    pixels = tiny.preprocess([ds.get(i).image for i in range(len(ds))])
    with torch.no_grad(), tiny.record("blocks.*.attn.pattern") as rec:
        tiny(pixels)
    expected = torch.stack([attention_entropy(rec[f"blocks.{i}.attn.pattern"]).double().mean(0) for i in range(6)])
    torch.testing.assert_close(res["attention_stats"]["entropy"].double(), expected, rtol=1e-6, atol=1e-9)


def test_batch_size_does_not_change_results(tiny, folder):
    a = vitscope.run(tiny, str(folder), [AttentionStats(), MeanActivation()], batch_size=1, progress=False)
    b = vitscope.run(tiny, str(folder), [AttentionStats(), MeanActivation()], batch_size=4, progress=False)
    for name in a:
        for key, t in a[name].tensors.items():
            torch.testing.assert_close(t, b[name][key], rtol=1e-5, atol=1e-6)


def test_corrupt_files_are_skipped_and_listed(tiny, folder):
    (folder / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (folder / "empty.png").write_bytes(b"")
    with pytest.warns(UserWarning):
        res = vitscope.run(tiny, str(folder), [AttentionStats()], batch_size=2, progress=False)
    assert res.num_images == 5
    assert sorted(s.path.rsplit("/", 1)[-1] for s in res.skipped) == ["broken.jpg", "empty.png"]
    with pytest.raises(ImageLoadError, match="broken.jpg"):
        vitscope.run(tiny, str(folder), [AttentionStats()], batch_size=2, progress=False, strict=True)


def test_empty_folder_is_a_clear_error(tiny, tmp_path):
    with pytest.raises(EmptyDatasetError, match="no images"):
        vitscope.run(tiny, str(tmp_path), [AttentionStats()], progress=False)


def test_attention_from_a_cnn_is_refused():
    cnn = vitscope.load_model("tiny-resnet")
    with pytest.raises(ValueError, match="CNN"):
        vitscope.run(cnn, "skimage", [AttentionStats()], limit=1, progress=False)
    res = vitscope.run(cnn, "skimage", [MeanActivation()], batch_size=4, limit=4, progress=False)
    assert "stages.3.mean" in res["mean_activation"].tensors


def test_bf16_autocast_run_agrees_with_fp32(tiny):
    a = vitscope.run(tiny, "skimage", [AttentionStats()], batch_size=4, limit=4, progress=False)
    b = vitscope.run(tiny, "skimage", [AttentionStats()], batch_size=4, limit=4, progress=False, dtype="bf16")
    torch.testing.assert_close(b["attention_stats"]["entropy"], a["attention_stats"]["entropy"], atol=2e-2, rtol=0)


def test_bad_arguments(tiny):
    with pytest.raises(ValueError, match="dtype"):
        vitscope.run(tiny, "skimage", [AttentionStats()], dtype="int8", progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        vitscope.run(tiny, "skimage", [AttentionStats()], batch_size=0, progress=False)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            vitscope.run(tiny, "skimage", [AttentionStats()], device="cuda", progress=False)


def test_quiet_when_not_a_terminal(tiny, capsys):
    vitscope.run(tiny, "skimage", [AttentionStats()], limit=2, batch_size=2)
    captured = capsys.readouterr()
    assert captured.out == "" and "vitscope" not in captured.err


def test_shards_take_contiguous_parts_and_together_every_image_once() -> None:

    from vitscope.data.memory import InMemoryImages
    from vitscope.engine.batches import iter_batches, shard_range

    source = InMemoryImages([np.zeros((8, 8, 3), dtype=np.uint8)] * 10)
    ranks = [[b.indices for _, b in iter_batches(source, 3, shard=(r, 2))] for r in range(2)]
    assert ranks == [[[0, 1, 2], [3, 4]], [[5, 6, 7], [8, 9]]]  # rank r: the r-th half, in batches of its own
    resumed = [b.indices for _, b in iter_batches(source, 2, start=7, shard=(1, 2))]
    assert resumed == [[7, 8], [9]]  # a resumed rank continues its own part, at any batch size
    for n in range(12):
        for world in (1, 2, 3, 5):
            parts = [shard_range(n, r, world) for r in range(world)]
            assert [i for p in parts for i in p] == list(range(n))
            assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_target_transforms_run_in_the_loader_and_skip_missing_targets() -> None:

    from vitscope.data.memory import InMemoryImages
    from vitscope.engine.batches import iter_batches

    source = InMemoryImages([np.zeros((8, 8, 3), dtype=np.uint8)] * 3, labels=[1, 2, 3])
    transforms = {"double": ("label", lambda v: 2 * v), "none": ("masks", lambda v: v)}
    (_, batch), = list(iter_batches(source, 4, transforms=transforms))
    assert batch.targets["double"] == [2, 4, 6] and batch.targets["none"] == [None, None, None]


def test_streamed_reductions_run_without_the_forwards_autocast(tiny):
    # rollout folds each block's pattern the moment the model makes it, inside the forward: under bf16 autocast its
    # matrix product ran in bf16, so the folded maps depended on the batch size (1e-4 of their scale)
    from vitscope.analyses.attention.rollout import AttentionRollout

    one = vitscope.run(tiny, "skimage", [AttentionRollout()], batch_size=1, limit=4, progress=False, dtype="bf16")
    four = vitscope.run(tiny, "skimage", [AttentionRollout()], batch_size=4, limit=4, progress=False, dtype="bf16")
    for key, value in four["attention_rollout"].tensors.items():
        if value.is_floating_point():
            assert value.dtype != torch.bfloat16, key
            torch.testing.assert_close(one["attention_rollout"].tensors[key], value, atol=1e-6, rtol=1e-5)
