"""A run says what its pass cost: wall time, images per second and the share spent waiting for decoded images
(``Results.seconds`` / ``loader_seconds``, results.json ``run``), for one pass and for a command's passes added up."""

from __future__ import annotations

import time

import numpy as np
import pytest
from PIL import Image

import vitscope
from vitscope.data.memory import InMemoryImages
from vitscope.engine.results import Results, pass_timing
from vitscope.engine.run import PassTally, tally_passes


def test_pass_timing_by_hand():
    assert pass_timing(100, 4.0, 1.0) == {"pass_seconds": 4.0, "images_per_second": 25.0, "loader_wait": 0.25}
    assert pass_timing(3, 3.0, 0.0) == {"pass_seconds": 3.0, "images_per_second": 1.0, "loader_wait": 0.0}
    assert pass_timing(0, 0.0, 0.0) is None  # no pass ran: nothing to say
    assert pass_timing(10, 1.0, 1.0000001)["loader_wait"] == 1.0  # clock rounding never makes it exceed 1


def test_a_resumed_pass_counts_only_the_images_it_fed():
    ran = Results({}, num_images=40, resumed_images=30, seconds=2.0, loader_seconds=0.5)
    assert ran.timing() == {"pass_seconds": 2.0, "images_per_second": 5.0, "loader_wait": 0.25}


def test_the_tally_adds_passes_up():
    tally = PassTally()
    assert tally.timing() is None  # every feature cached: no pass
    tally.add(Results({}, num_images=10, seconds=1.0, loader_seconds=0.5, workers=2))
    tally.add(Results({}, num_images=30, resumed_images=10, seconds=3.0, loader_seconds=0.5, workers=1))
    assert (tally.images, tally.workers, tally.resumed_images) == (30, 2, 10)
    assert tally.timing() == {"pass_seconds": 4.0, "images_per_second": 7.5, "loader_wait": 0.25}


class _Slow(InMemoryImages):
    """Images that take 50 ms each to read: the loader, not the model, sets the pace."""

    def load(self, i: int) -> Image.Image:
        time.sleep(0.05)
        return super().load(i)


@pytest.mark.parametrize("slow", [False, True], ids=["images in memory", "slow loading"])
def test_a_run_measures_its_pass_and_its_wait_for_the_loader(slow):
    images = [np.full((32, 32, 3), 10 * i, dtype=np.uint8) for i in range(8)]
    source = (_Slow if slow else InMemoryImages)(images)
    backbone = vitscope.load_model("tiny-vit")
    with tally_passes() as tally:
        ran = vitscope.run(backbone, source, ["attention_distance"], batch_size=4, workers=0, device="cpu")
    assert 0 < ran.loader_seconds <= ran.seconds
    assert tally.seconds == ran.seconds and tally.images == 8
    timing = ran.timing()
    assert timing["images_per_second"] == pytest.approx(8 / ran.seconds, rel=1e-2)
    if slow:  # 0.4 s of reading against a forward of milliseconds
        assert ran.loader_seconds > 0.3 and timing["loader_wait"] > 0.5


class _SlowOnRankOne(InMemoryImages):
    """Rank 1 takes 0.1 s an image; rank 0 reads at once."""

    def load(self, i: int) -> Image.Image:
        import torch.distributed as dist

        if dist.get_rank() == 1:
            time.sleep(0.1)
        return super().load(i)


def _timed_rank(rank: int, world: int, port: int, out: str) -> None:
    import json

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        images = [np.full((32, 32, 3), 10 * i, dtype=np.uint8) for i in range(8)]
        ran = vitscope.run(vitscope.load_model("tiny-vit"), _SlowOnRankOne(images), ["attention_distance"],
                           batch_size=2, workers=0, device="cpu", distributed=True, progress=False)
        with open(f"{out}/rank{rank}.json", "w") as f:
            json.dump({"seconds": ran.seconds, "images": ran.num_images}, f)
    finally:
        dist.destroy_process_group()


def test_a_pass_over_several_processes_takes_as_long_as_its_slowest(tmp_path):
    """Each process timed itself, so rank 0, done at once, reported its own instant as the whole pass."""
    import json

    from helpers.processes import run_gloo

    run_gloo(_timed_rank, str(tmp_path))
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert got[0] == got[1] and got[0]["images"] == 8
    assert got[0]["seconds"] >= 0.4  # rank 1's four images at 0.1 s each
