"""The one writer: layout, proportionate files, the output-folder check, the manifest, nothing half-written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from vitscope.analyses.result import SMALL, Figure, Result, SummaryResult
from vitscope.outputs import OutputError, RunResult, prepare_output, write_run
from vitscope.outputs.folder import MANIFEST


def _figure(stem: str) -> Figure:
    def draw(path: Path) -> list[Path]:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(2, 2))
        ax.plot([0, 1], [1, 0])
        paths = [path.with_suffix(".png"), path.with_suffix(".svg")]
        for p in paths:
            fig.savefig(p)
        plt.close(fig)
        return paths
    return Figure(stem, draw, stem.title(), f"caption of {stem}", "paper 002, fig. 1")


class _Small(Result):
    def figures(self) -> list[Figure]:
        return [_figure(f"{self.name}_curve")]


def _run(name: str = "thing", big: int = SMALL + 1) -> RunResult:
    tensors = {"curve": torch.arange(4.0), "maps": torch.ones(big), "ids": torch.arange(big),
               "fine": torch.full((big,), 1 / 3, dtype=torch.float64), "images": torch.zeros(big, dtype=torch.uint8)}
    result = _Small(name, tensors, {"model": "m"}, intro="intro")
    return RunResult("analyze", config={"model": "m"}, results={name: result}, models=[{"id": "m"}],
                     data={"name": "d"}, num_images=3)


def test_layout_summaries_tables_arrays_figures_and_report(tmp_path) -> None:
    path = write_run(tmp_path / "out", _run(), progress=False)
    out = path.parent
    doc = json.loads(path.read_text())
    entry = doc["analyses"]["thing"]
    assert entry["summary"]["curve"] == [0.0, 1.0, 2.0, 3.0]
    assert entry["summary"]["maps"] == {"shape": [SMALL + 1], "mean": 1.0}  # large: summarised in the JSON
    assert entry["files"] == {"tables": ["tables/thing.csv", "tables/thing.json"],
                              "figures": ["figures/thing_curve.png", "figures/thing_curve.svg"],
                              "arrays": ["arrays/thing.npz"]}
    with np.load(out / "arrays/thing.npz") as arrays:  # ... and whole in the arrays file
        assert arrays["maps"].shape == (SMALL + 1,)
        assert arrays["fine"].dtype == np.float32 and arrays["ids"].dtype == np.int64  # float64 stored as float32
        assert arrays["fine"][0] == np.float32(1 / 3)
        assert "images" not in arrays  # the pictures a result draws on: its figures show them
    table = (out / "tables/thing.csv").read_text()
    assert "curve" in table and "maps" not in table  # tables hold what a person reads
    html = (out / "report.html").read_text()
    assert "caption of thing_curve" in html and "paper 002, fig. 1" in html and "intro" in html
    assert not any(p.name.startswith(".staging") for p in out.iterdir())
    assert json.loads((out / MANIFEST).read_text())["files"] == sorted(
        ["results.json", "report.html", *entry["files"]["tables"], *entry["files"]["figures"], "arrays/thing.npz"])


def test_a_rerun_replaces_its_own_files_and_keeps_the_users(tmp_path) -> None:
    out = tmp_path / "out"
    write_run(out, _run("first"), progress=False)
    (out / "notes.txt").write_text("mine")
    write_run(out, _run("second"), progress=False)
    names = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert not any("first" in n for n in names)  # the previous run's figures and tables are gone
    assert "notes.txt" in names and "figures/second_curve.png" in names


def test_an_output_path_that_is_a_file_is_one_line(tmp_path) -> None:
    target = tmp_path / "taken"
    target.write_text("x")
    with pytest.raises(OutputError, match="is a file; give a folder") as info:
        prepare_output(target)
    assert "\n" not in str(info.value)
    with pytest.raises(OutputError):
        write_run(target, _run(), progress=False)
    assert target.read_text() == "x"


def test_a_failing_figure_leaves_the_previous_outputs_whole(tmp_path) -> None:
    out = tmp_path / "out"
    write_run(out, _run("good"), progress=False)
    before = (out / "results.json").read_text()

    def broken(path: Path) -> list[Path]:
        raise RuntimeError("drawing failed")

    bad = RunResult("analyze", results={"bad": SummaryResult("bad", {"x": 1}, figures=[Figure("bad", broken, "B",
                                                                                               "c")])})
    with pytest.raises(RuntimeError, match="drawing failed"):
        write_run(out, bad, progress=False)
    assert (out / "results.json").read_text() == before
    assert not any(p.name.startswith(".staging") for p in out.iterdir())


def test_atomic_path_replaces_only_when_the_block_succeeds(tmp_path) -> None:
    from vitscope.atomic import atomic_path

    target = tmp_path / "sub" / "image.png"
    with atomic_path(target) as tmp:
        assert tmp.suffix == ".png" and tmp.parent == target.parent  # writers that read the suffix still work
        tmp.write_bytes(b"first")
    assert target.read_bytes() == b"first"
    with pytest.raises(OSError, match="disk full"):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise OSError("disk full")
    assert target.read_bytes() == b"first" and sorted(p.name for p in target.parent.iterdir()) == ["image.png"]


def test_leftovers_of_a_killed_writer_are_removed_and_a_live_ones_kept(tmp_path) -> None:
    import os
    import subprocess

    from vitscope.atomic import remove_leftovers

    dead = subprocess.Popen(["true"])
    dead.wait()
    mine, theirs = f"vitscope-{os.getpid()}", f"vitscope-{dead.pid}"
    for name in (f".results.json.{theirs}.tmp", f".figure.{theirs}.tmp.png", f".results.json.{mine}.tmp",
                 "results.json", ".vitscope-manifest.json",
                 f".notes.{dead.pid}.tmp", f".notes.{dead.pid}.tmp.txt"):  # a user's own files, no marker: kept
        (tmp_path / name).write_text("x")
    (tmp_path / f".vitscope-staging-{dead.pid}-0a1b").mkdir()
    (tmp_path / f".vitscope-staging-{dead.pid}-0a1b" / "report.html").write_text("half")
    (tmp_path / f".vitscope-staging-{os.getpid()}-0a1b").mkdir()
    (tmp_path / f".staging-{dead.pid}-0a1b").mkdir()  # a user's
    (tmp_path / f".huge.vitscope-{'9' * 40}.tmp").write_text("x")  # no process has such an id
    removed = remove_leftovers(tmp_path)
    assert f".huge.vitscope-{'9' * 40}.tmp" in removed
    removed.remove(f".huge.vitscope-{'9' * 40}.tmp")
    assert sorted(removed) == sorted([f".results.json.{theirs}.tmp", f".figure.{theirs}.tmp.png",
                                      f".vitscope-staging-{dead.pid}-0a1b"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([
        f".results.json.{mine}.tmp", "results.json", ".vitscope-manifest.json", f".notes.{dead.pid}.tmp",
        f".notes.{dead.pid}.tmp.txt", f".staging-{dead.pid}-0a1b", f".vitscope-staging-{os.getpid()}-0a1b"])
    # a container restarts its command with the same process id: before writing, a run clears its own id's
    assert sorted(remove_leftovers(tmp_path, stale_pids=frozenset({os.getpid()}))) == sorted(
        [f".results.json.{mine}.tmp", f".vitscope-staging-{os.getpid()}-0a1b"])


def test_every_temporary_name_is_one_remove_leftovers_recognises(tmp_path, monkeypatch) -> None:
    """The names the writers use (atomic files, staging folders, run state, checkpoints) are the ones cleaned."""
    import os

    from vitscope.atomic import _LEFTOVER, staging_name, temporary_path

    for path in (tmp_path / "results.json", tmp_path / "state.pt", tmp_path / "model.safetensors",
                 tmp_path / ".vitscope-manifest.json", tmp_path / "noext"):
        match = _LEFTOVER.match(temporary_path(path).name)
        assert match is not None and int(match.group("pid")) == os.getpid(), temporary_path(path).name
    assert int(_LEFTOVER.match(staging_name("0a1b")).group("owner")) == os.getpid()


@pytest.mark.parametrize("moves_before_the_kill", [0, 1, 2, 3])
def test_a_kill_while_publishing_leaves_only_whole_files(tmp_path, monkeypatch, moves_before_the_kill) -> None:
    """The process dies after k files were moved into place: every file with a final name is either the old
    run's or the new run's, whole; the next run removes the killed run's staging folder."""
    import os
    import subprocess

    from vitscope.outputs.folder import Staging

    out = prepare_output(tmp_path / "out")
    old = Staging(out)
    for rel, text in (("results.json", '{"run": "old"}'), ("tables/a.csv", "x\n1\n"),
                      ("report.html", "<html>old</html>")):
        old.path(rel).write_text(text)
    old.publish(last=["report.html", "results.json"])

    dead = subprocess.Popen(["true"])
    dead.wait()
    monkeypatch.setattr(os, "getpid", lambda: dead.pid)  # the killed process's staging folder carries its pid
    new = Staging(out)
    monkeypatch.undo()
    for rel, text in (("results.json", '{"run": "new"}'), ("tables/a.csv", "x\n2\n"), ("tables/b.csv", "y\n3\n"),
                      ("report.html", "<html>new</html>")):
        new.path(rel).write_text(text)
    real_replace, moved = os.replace, []

    def replace_then_die(src, dst):
        if len(moved) == moves_before_the_kill:
            os._exit(9)  # a real end: no handler, no finally runs (SIGKILL)
        real_replace(src, dst)
        moved.append(dst)

    child = os.fork()
    if child == 0:  # the process that is killed while it publishes
        os.replace = replace_then_die
        new.publish(last=["report.html", "results.json"])
        os._exit(0)
    assert os.waitpid(child, 0)[1] >> 8 == 9
    assert json.loads((out / "results.json").read_text()) == {"run": "old"}  # results.json moves last
    assert (out / "report.html").read_text() in ("<html>old</html>", "<html>new</html>")
    assert (out / "tables" / "a.csv").read_text() in ("x\n1\n", "x\n2\n")
    assert new.root.exists()  # what the killed run left
    prepare_output(out)  # the next run into the folder
    assert not new.root.exists() and not [p for p in out.rglob("*") if ".tmp" in p.name or "staging" in p.name]


@pytest.mark.parametrize("fails_at", [0, 2, 4, "manifest"])
def test_a_publish_that_fails_puts_the_previous_run_back(tmp_path, monkeypatch, fails_at) -> None:
    """A move or the manifest failing (a read-only subfolder, a full disk) left the new run's files beside the old
    results.json, or the new results.json beside the old manifest, and a temporary manifest."""
    import os

    from vitscope.atomic import OUTPUT_MANIFEST
    from vitscope.outputs.folder import Staging

    out = prepare_output(tmp_path / "out")
    old = Staging(out)
    for rel, text in (("results.json", "old"), ("tables/a.csv", "old a"), ("tables/gone.csv", "old gone"),
                      ("report.html", "old report")):
        old.path(rel).write_text(text)
    old.publish(last=["report.html", "results.json"])
    before = {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*") if p.is_file()}
    new = Staging(out)
    for rel in ("results.json", "tables/a.csv", "tables/b.csv", "report.html"):
        new.path(rel).write_text("new")
    real_replace, moves, failed = os.replace, [], []

    def replace_then_fail(src, dst):
        if not failed and (fails_at == len(moves) or (fails_at == "manifest" and Path(dst).name == OUTPUT_MANIFEST)):
            failed.append(dst)  # once: the moves back succeed
            raise OSError(28, "No space left on device")
        real_replace(src, dst)
        moves.append(dst)

    monkeypatch.setattr(os, "replace", replace_then_fail)
    with pytest.raises(OSError, match="No space left"):
        new.publish(last=["report.html", "results.json"])
    monkeypatch.undo()
    after = {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*") if p.is_file()}
    assert after == before  # every old file (the dropped one too) and the old manifest; nothing new, no leftover


def test_two_results_that_would_write_one_file_are_refused_before_anything_is_written(tmp_path) -> None:
    import pandas as pd

    from vitscope.errors import VitscopeRuntimeError

    # the probe sweep once named knn_cls and knn_spatial_mean alike: one table silently replaced the other
    run = RunResult("probe", results={key: SummaryResult("knn_probe", {"accuracy": 0.5}, tables={
        "knn_probe": pd.DataFrame({"accuracy": [0.5]})}) for key in ("knn_cls", "knn_spatial_mean")})
    with pytest.raises(VitscopeRuntimeError, match="'knn_cls' and 'knn_spatial_mean' would both write "
                                                   "tables/knn_probe"):
        write_run(tmp_path / "out", run, progress=False)
    assert not (tmp_path / "out" / "results.json").exists() and not (tmp_path / "out" / "tables").exists()


def test_a_table_without_columns_is_not_written_and_the_others_are(tmp_path) -> None:
    """An analysis with nothing to tabulate (a probe that could not score) wrote a 1-byte CSV no reader opens."""
    import pandas as pd

    class _Empty(Result):
        def tables(self) -> dict[str, pd.DataFrame]:
            return {"nothing": pd.DataFrame(), "rows": pd.DataFrame({"a": [1, 2]})}

    run = RunResult("analyze", config={}, results={"probe": _Empty("probe", {}, {})}, models=[{"id": "m"}],
                    data={"name": "d"}, num_images=1)
    path = write_run(tmp_path / "out", run)
    doc = json.loads(path.read_text())
    assert doc["analyses"]["probe"]["files"]["tables"] == ["tables/rows.csv", "tables/probe.json"]
    assert not (tmp_path / "out" / "tables" / "nothing.csv").exists()
    assert pd.read_csv(tmp_path / "out" / "tables" / "rows.csv")["a"].tolist() == [1, 2]


def test_sections_whose_labels_slug_alike_get_ids_of_their_own(tmp_path) -> None:
    results = {name: _Small(name, {"curve": torch.arange(4.0)}, {}, intro="intro")
               for name in ("attention_stats@x", "attention_stats@X", "attention_stats@é", "attention_stats")}
    run = RunResult("analyze", config={}, results=results, models=[{"id": "m"}], data={"name": "d"}, num_images=1)
    html = (write_run(tmp_path / "out", run).parent / "report.html").read_text()
    import re

    ids = re.findall(r'<section id="([^"]*)"', html)
    assert len(ids) == len(set(ids)) and len(ids) >= 4, ids


def test_the_environment_names_the_libraries_that_decide_the_numbers() -> None:
    """Decoding and resizing (Pillow, OpenCV), the arithmetic around them (numpy) and the probes (scikit-learn)."""
    import platform

    import cv2
    import numpy
    import PIL
    import sklearn

    from vitscope.outputs.writer import environment

    env = environment()
    assert env["python"] == platform.python_version() and env["torch"] == torch.__version__
    assert env["torch_threads"] == torch.get_num_threads()  # a training's float32 sums round by them
    assert env["numpy"] == numpy.__version__ and env["pillow"] == PIL.__version__
    assert env["scikit-learn"] == sklearn.__version__
    assert env["opencv"].startswith(cv2.__version__)  # the wheel's version adds a build number: 4.10.0.84


def test_the_device_that_ran_is_recorded_beside_the_one_asked_for(tmp_path, monkeypatch) -> None:
    import vitscope
    from helpers.images import random_pngs
    from vitscope.engine.settings import describe_device

    photos = random_pngs(tmp_path / "photos", [(40, 40)] * 3)
    vitscope.analyze("tiny-vit", photos, ["mean_activation"], out=tmp_path / "out", device="cpu", progress=False)
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["config"]["device"] == "cpu" and doc["run"]["device"] == {"device": "cpu"}
    if not torch.cuda.is_available():
        assert describe_device(None) == {"device": "cpu"}
        # on a GPU "auto" and a bare "cuda" name the GPU that ran: its index, name and CUDA version
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: f"GPU number {index}")
        monkeypatch.setattr(torch.version, "cuda", "12.4")
        want = {"device": "cuda:1", "name": "GPU number 1", "cuda": "12.4"}
        assert describe_device(None) == want and describe_device("cuda") == want
        assert describe_device("cuda:0") == {"device": "cuda:0", "name": "GPU number 0", "cuda": "12.4"}


def test_atomic_outputs_get_the_mode_open_gives_even_from_writers_that_make_them_private(tmp_path):
    """safetensors creates its files 0600: an SAE's or a zoo model's weights were unreadable to a shared group."""
    import os
    import stat

    from safetensors.torch import save_file

    from vitscope.atomic import atomic_path

    old = os.umask(0o022)
    try:
        with atomic_path(tmp_path / "w.safetensors") as partial:
            save_file({"w": torch.zeros(2)}, str(partial))
        with atomic_path(tmp_path / "a.txt") as partial:
            partial.write_text("x")
            os.chmod(partial, 0o600)
    finally:
        os.umask(old)
    assert [stat.S_IMODE((tmp_path / n).stat().st_mode) for n in ("w.safetensors", "a.txt")] == [0o644, 0o644]
