"""Row stores merge over processes through shard files in a shared folder, never through the process group."""

from __future__ import annotations

import functools
import pickle

import numpy as np
import torch

from helpers.processes import run_gloo
from vitscope.analyses.base import Analysis
from vitscope.cache.rowstore import RowStore, exported_when_pickled

ROWS = {0: np.arange(0, 300), 1: np.arange(300, 700)}  # rank -> dataset indices it saw
WIDTH = 64


class Rows(Analysis):
    """Keeps a float row per image in a disk-backed store (as the probes do)."""

    def __init__(self) -> None:
        super().__init__()
        self.add_state("store", functools.partial(RowStore, spill_bytes=20_000), reduce="cat")

    def required_hooks(self, spec):
        return []

    def update(self, record, batch):
        index = np.asarray(batch, dtype=np.int64)
        self.store.append({"index": index, "x": np.repeat(index[:, None], WIDTH, axis=1).astype(np.float32)})

    def compute(self):
        return {}


def _worker(rank: int, world: int, port: int, out: str) -> None:
    import os

    import torch.distributed as dist

    os.environ["VITSCOPE_EXCHANGE_DIR"] = f"{out}/exchange"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        a = Rows()
        for part in np.array_split(ROWS[rank], 5):
            a.update({}, part)
        sent: list[int] = []
        original = dist.all_gather_object

        def measured(parts, obj, group=None):
            sent.append(len(pickle.dumps(obj)))
            return original(parts, obj, group=group)

        dist.all_gather_object = measured
        a.sync()
        dist.all_gather_object = original
        torch.save({"index": torch.from_numpy(a.store.sorted_column("index", "index")),
                    "x": torch.from_numpy(a.store.sorted_column("x", "index")), "sent": max(sent)},
                   f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_rows_travel_as_files_and_every_process_ends_with_all_of_them(tmp_path) -> None:
    run_gloo(_worker, str(tmp_path))
    row_bytes = 400 * WIDTH * 4  # rank 1's rows alone
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert got["index"].tolist() == list(range(700))
        assert torch.equal(got["x"][:, 0], got["index"].float()) and got["x"].shape == (700, WIDTH)
        assert got["sent"] < row_bytes / 20  # paths and columns only, not the rows
    assert list((tmp_path / "exchange").glob("vitscope-exchange-*/rows-*/shard-*/x.bin"))


def test_a_store_pickled_for_another_process_holds_no_rows(tmp_path) -> None:
    store = RowStore(spill_bytes=1 << 30)  # everything in memory
    store.append({"index": np.arange(1000), "x": np.ones((1000, 32), dtype=np.float32)})
    with exported_when_pickled(tmp_path):
        blob = pickle.dumps(store)
    assert len(blob) < 2000 < len(pickle.dumps(store))
    copy = pickle.loads(blob)
    assert np.array_equal(copy.column("index"), np.arange(1000)) and copy.column("x").sum() == 32000
