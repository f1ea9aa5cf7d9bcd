"""WebDataset shards under ``torchrun``: two processes read contiguous parts of the sample positions (whole shards
but where a part ends mid-shard; the index makes any position readable) and give the numbers of one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from golden.compare import differences
from helpers.cli import ENV, cli
from helpers.webdataset_shards import write_shards


@pytest.mark.skipif(os.environ.get("VITSCOPE_DISTRIBUTED_CHECK") != "1",
                    reason="make distributed-check runs WebDataset shards over two torchrun processes (6 s; the suite "
                           "checks the shard rule and reading any position in one process)")
def test_two_processes_over_shards_give_the_numbers_of_one(tmp_path) -> None:
    data = f"{write_shards(tmp_path / 'shards')}/{{000000..000002}}.tar::webdataset"
    common = ["analyze", "-m", "tiny-vit-sup", "-d", data, "-a", "attention_distance,cka,knn_probe", "-b", "4",
              "--device", "cpu", "--no-resume"]
    assert cli(*common, "-o", str(tmp_path / "one")).returncode == 0
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", "-m", "vitscope",
               *common, "-o", str(tmp_path / "two")]
    proc = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    one, two = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("one", "two"))
    assert one["num_images"] == two["num_images"] == 16
    found = differences(one["analyses"], two["analyses"], rtol=1e-6, atol=1e-6)
    assert not found, "\n".join(found)
