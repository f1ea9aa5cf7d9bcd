"""A real ``torchrun`` of two gloo processes gives the numbers of one process, and one results.json.

Each rank reads a contiguous half of the images, each rank merges the declared state of every analysis at the end, and
rank 0 alone writes. Every number of results.json must equal the one-process run (or the committed golden
fixture) within 1e-6, counts and indices exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from golden.compare import differences, normalise
from helpers.cli import ENV, cli
from vitscope.data.synthetic.write import synthesize

#: compare and probe over two processes, and analyze over every group and killed and resumed rank by rank, run in
#: `make distributed-check` (their merges are the analyses' and the feature rows' own, which the suite checks in one
#: process; the suite keeps two processes of analyze stopped, resumed and compared with one in
#: tests/e2e/test_plugin_everywhere.py, and a failing process here)
EVERY_COMMAND = pytest.mark.skipif(os.environ.get("VITSCOPE_DISTRIBUTED_CHECK") != "1",
                                   reason="make distributed-check runs every command and group over two processes")


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    root = synthesize(tmp_path_factory.mktemp("coco"), "coco", n=12, size=64, seed=5)
    broken = sorted((root / "val2017").iterdir())[6]  # batch 1: rank 1 meets it
    broken.write_bytes(b"not an image")
    return root, broken


def _torchrun(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
               "-m", "vitscope", *args]
    return subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300)


@EVERY_COMMAND
def test_two_processes_give_the_committed_numbers(tmp_path_factory, tmp_path) -> None:
    """The golden run with every analysis group, under torchrun, against its committed fixture."""
    from golden.execute import write_data
    from golden.runs import RUNS, fixture, normalised

    run = next(r for r in RUNS if r.name == "analyze_groups")  # 12 images: each rank reads 6, in batches of 4 and 2
    roots = write_data(tmp_path_factory.mktemp("golden"), set(run.data))
    out = tmp_path / "two"
    proc = _torchrun(*run.args(roots, out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("report:") == 1  # rank 0 reports; rank 1 prints nothing
    found = differences(fixture(run.name), normalised(out, roots), allow_extra=True, rtol=run.tolerance,
                        atol=run.tolerance)
    assert not found, "\n".join(found)
    assert not any(p.name.startswith(".") and p.name != ".vitscope-manifest.json" for p in out.iterdir())


def test_the_library_refuses_distributed_without_a_process_group() -> None:
    import vitscope

    if "WORLD_SIZE" in os.environ:
        pytest.skip("running under torchrun")
    backbone = vitscope.load_model("tiny-vit")
    with pytest.raises(RuntimeError, match="torchrun"):
        vitscope.run(backbone, "skimage", [], distributed=True)


@EVERY_COMMAND
def test_a_killed_two_process_run_resumes_rank_by_rank(coco, tmp_path) -> None:
    root, broken = coco
    common = ["analyze", "-m", "tiny-vit-sup", "-d", f"{root}::coco", "-a", "attention_distance,cka,knn_probe",
              "-b", "4", "--device", "cpu"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert cli(*common, "-o", str(one), "--no-resume").returncode == 0
    stop = {**ENV, "VITSCOPE_STOP_AFTER_BATCHES": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", "-m", "vitscope",
               *common, "-o", str(two)]
    killed = subprocess.run(command, capture_output=True, text=True, env=stop, timeout=300)
    assert killed.returncode != 0 and "state saved" in killed.stderr, killed.stderr
    state = sorted(p.name for p in (two / ".vitscope-state").iterdir())
    assert state == ["tiny-vit-sup.rank0-of-2.pt", "tiny-vit-sup.rank1-of-2.pt"]
    proc = _torchrun(*common, "-o", str(two))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.count("resuming from saved state: 4 images already done") == 1  # rank 0 speaks
    a, b = (json.loads((d / "results.json").read_text()) for d in (one, two))
    assert [s["path"] for s in b["skipped"]] == [str(broken)]  # reported once, by the rank that met it
    assert b["run"]["resumed_images"] == 4 + 3  # a batch on each rank (rank 1's holds the unreadable file)
    assert (a["run"]["processes"], b["run"]["processes"]) == (1, 2)  # the run says how it was split
    assert b["run"]["earlier_parts"] == [{"images": 7, "batch_size": 4, "workers": 0}]  # both ranks' images
    found = differences(normalise(a, [(one, "<OUT>")]), normalise(b, [(two, "<OUT>")]))
    assert found == ["$.config.resume: expected False, got True"], "\n".join(found)
    assert not (two / ".vitscope-state").exists()


@EVERY_COMMAND
def test_compare_over_two_processes_gives_the_numbers_of_one(coco, tmp_path) -> None:
    root, _ = coco
    common = ["compare", "--models", "tiny-vit-sup,tiny-resnet-sup", "-d", f"{root}::coco", "-b", "4", "--device",
              "cpu", "--no-resume"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert cli(*common, "-o", str(one)).returncode == 0
    proc = _torchrun(*common, "-o", str(two))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    a, b = (json.loads((d / "results.json").read_text()) for d in (one, two))
    assert (a["run"]["processes"], b["run"]["processes"]) == (1, 2)
    found = differences(normalise(a, [(one, "<OUT>")]), normalise(b, [(two, "<OUT>")]))
    assert not found, "\n".join(found)


@EVERY_COMMAND
def test_probe_over_two_processes_gives_the_numbers_of_one(tmp_path) -> None:
    """Each process extracts its batches into its own rows; rank 0 commits one cache entry; numbers as one."""
    root = synthesize(tmp_path / "data", "imagefolder", n=12, size=48, seed=2)
    common = ["probe", "--model", "tiny-vit", "-d", f"{root}::imagefolder", "-b", "4", "--device", "cpu",
              "--blocks", "0,-1"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert cli(*common, "-o", str(one), "--cache", str(tmp_path / "cache1")).returncode == 0
    proc = _torchrun(*common, "-o", str(two), "--cache", str(tmp_path / "cache2"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("report:") == 1
    a, b = (json.loads((d / "results.json").read_text()) for d in (one, two))
    assert (a["run"]["processes"], b["run"]["processes"]) == (1, 2)
    a["config"].pop("cache"), b["config"].pop("cache")
    found = differences(normalise(a, [(one, "<OUT>")]), normalise(b, [(two, "<OUT>")]))
    assert not found, "\n".join(found)
    assert sorted(p.name for p in (tmp_path / "cache2").iterdir() if p.name != "tmp") == sorted(
        p.name for p in (tmp_path / "cache1").iterdir() if p.name != "tmp")  # the same entries, once
    assert not list((tmp_path / "cache2" / "tmp").glob("pass-*"))  # working folders removed


def test_a_failing_process_stops_every_process_with_one_line_each(coco, tmp_path) -> None:
    root, broken = coco
    proc = _torchrun("analyze", "-m", "tiny-vit-sup", "-d", f"{root}::coco", "-a", "attention_distance", "-b", "4",
                     "--device", "cpu", "--strict", "--no-resume", "-o", str(tmp_path / "o"))
    assert proc.returncode != 0
    ours = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    cause = f"error: cannot read {broken}: cannot identify image file"
    # rank 0 says why it stops too (in either order), unless torchrun ended it first; no traceback from either
    others = [line for line in ours if line != cause]
    assert cause in ours and len(ours) <= 2, proc.stderr
    assert all("another process of this run stopped" in line for line in others), proc.stderr
    agent = proc.stderr.find("torch/distributed/elastic")  # torchrun's own report of the failed process
    assert "Traceback" not in proc.stderr[:agent], proc.stderr


def test_commands_that_run_as_one_process_refuse_torchrun(tmp_path) -> None:
    torchrun = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}
    proc = cli("featviz", "--model", "tiny-vit", "-o", str(tmp_path / "p"), env=torchrun)
    assert proc.returncode == 2 and "under torchrun only analyze, compare, probe" in proc.stderr, proc.stderr
    assert not (tmp_path / "p").exists()
