"""docs/errors.md, outputs: where the results cannot go. A full disk and a folder that may not be written are
injected (tests run as root here): the write raises the real ``OSError`` the system would."""

from __future__ import annotations

import errno
import json
import os
import pathlib

import pytest

from helpers.bad_input import analyze, cli, finished, folder_with_one_good_image, one_error
from vitscope.errors import VitscopeValueError


@pytest.fixture
def photos(tmp_path):
    return folder_with_one_good_image(tmp_path)


def test_output_path_is_a_file(photos, tmp_path):
    (tmp_path / "out").write_text("my notes")
    one_error(analyze(photos, tmp_path / "out"), "--out")
    assert (tmp_path / "out").read_text() == "my notes"


@pytest.mark.parametrize("command", [("analyze", "-m", "tiny-vit", "-d", "{photos}"),
                                     ("compare", "-M", "tiny-vit,tiny-vit-sup", "-d", "{photos}"),
                                     ("featviz", "-m", "tiny-vit-sup", "-u", "blocks.5.mlp.post:3"),
                                     ("attribute", "{image}", "-m", "tiny-vit-sup"),
                                     ("artifacts", "-m", "tiny-vit", "-d", "{photos}")])
def test_output_path_is_a_file_before_any_model_loads(photos, tmp_path, command):
    """analyze, featviz and attribute loaded the model (and printed its input) before refusing the file."""
    (tmp_path / "out").write_text("my notes")
    args = [c.format(photos=photos, image=photos / "good.png") for c in command]
    result = cli(*args, "-o", str(tmp_path / "out"))
    one_error(result, f"--out {tmp_path / 'out'} is a file")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr  # nothing before it: no model loaded
    assert (tmp_path / "out").read_text() == "my notes"


def test_output_folder_not_writable(photos, tmp_path, monkeypatch):
    make_folder = pathlib.Path.mkdir

    def refuse(self, *args, **kwargs):
        if self.name == "out":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return make_folder(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "mkdir", refuse)
    one_error(analyze(photos, tmp_path / "out"), "cannot create the output folder")


def test_output_folder_not_writable_for_zoo_build(tmp_path, monkeypatch):
    """A read-only zoo folder (an installed package's shipped weights) was found out after the training, which it
    lost. The folder refuses every file opened in it, as a read-only mount would (root writes anywhere else)."""
    from vitscope.zoo import build as zoo_build

    zoo = tmp_path / "zoo"
    zoo.mkdir()
    open_file = os.open

    def read_only(path, flags, *args, **kwargs):
        if zoo in (pathlib.Path(path), pathlib.Path(path).parent) and flags & (os.O_WRONLY | os.O_RDWR):
            raise PermissionError(errno.EROFS, "Read-only file system", str(path))
        return open_file(path, flags, *args, **kwargs)

    trained = []
    monkeypatch.setattr(os, "open", read_only)
    monkeypatch.setattr(zoo_build, "_build", lambda *args, **kwargs: trained.append(args))
    monkeypatch.setenv("VITSCOPE_ZOO_DIR", str(zoo))
    for directory in (None, zoo):  # the default folder, and --dir
        with pytest.raises(VitscopeValueError) as refused:
            next(zoo_build.build_many(["tiny-vit-sup"], directory, steps=1))
        assert str(refused.value) == (
            f"cannot write into the zoo folder {zoo} (Read-only file system): build into a folder of your own with "
            "--dir DIR (directory= from Python), and load its models with VITSCOPE_ZOO_DIR=DIR")
    assert trained == [] and list(zoo.iterdir()) == []


def test_output_disk_full(photos, tmp_path, monkeypatch):
    out = tmp_path / "out"
    first = finished(analyze(photos, out), out)
    write_text = pathlib.Path.write_text

    def full(self, *args, **kwargs):
        if self.name == "results.json":
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return write_text(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", full)
    one_error(analyze(photos, out, analyses="attention_stats,attention_distance"),
              "[Errno 28] No space left on device")
    monkeypatch.undo()
    assert json.loads((out / "results.json").read_text()) == first  # the last finished run stays whole
    assert not [p for p in out.rglob("*") if "staging" in p.name or ".tmp" in p.name]


def test_output_from_a_run_with_other_settings(photos, tmp_path):
    out = tmp_path / "out"
    finished(analyze(photos, out, analyses="attention_stats,attention_distance"), out)
    (out / "my_notes.txt").write_text("kept")
    stopped = analyze(photos, out, "-b", "1", env={"VITSCOPE_STOP_AFTER_BATCHES": "1"})  # leaves a saved state
    assert stopped.returncode == 130
    other = analyze(photos, out, "-b", "1", analyses="attention_distance")
    doc = finished(other, out)
    assert "ignoring saved state" in other.stderr and "starting over" in other.stderr
    assert list(doc["analyses"]) == ["attention_distance"] and (out / "my_notes.txt").read_text() == "kept"
    assert not (out / "tables" / "attention_stats.csv").exists()  # the old run's own files are replaced


def test_output_folder_in_use(photos, tmp_path):
    """Two runs into one folder mixed their files (results.json of one, report.html of the other), both exit 0."""
    import subprocess
    import sys

    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from pathlib import Path; "
                               "from vitscope.outputs.folder import prepare_output; prepare_output(Path(sys.argv[1])); "
                               "print('held', flush=True); sys.stdin.read()", str(out)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        one_error(analyze(photos, out), f"another vitscope run is writing into --out {out}")
        assert list(out.iterdir()) == []
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    finished(analyze(photos, out), out)  # the first run ended: the folder is free


@pytest.mark.parametrize("linked", ["tables", "figures/more"])
def test_output_folder_with_a_linked_subfolder(photos, tmp_path, linked):
    """A subfolder of --out that is a link (a colleague's results folder) took the outputs elsewhere: files there
    were overwritten. Refused before the pass for the writer's own subfolders, and at publishing for any other."""
    from vitscope.outputs.folder import OutputError, Staging, prepare_output

    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "attention_stats.csv").write_text("someone's table")
    (out / linked).parent.mkdir(parents=True, exist_ok=True)
    (out / linked).symlink_to(elsewhere)
    if linked == "tables":
        one_error(analyze(photos, out), f"{out / 'tables'} is a link (to {elsewhere}): vitscope writes its outputs "
                                        "inside the output folder")
        assert not (out / "results.json").exists()
    else:
        staging = Staging(prepare_output(out))
        staging.path("figures/more/attention_stats.csv").write_text("new")
        with pytest.raises(OutputError, match="figures/more is a link"):
            staging.publish()
    assert (elsewhere / "attention_stats.csv").read_text() == "someone's table"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["attention_stats.csv"]

