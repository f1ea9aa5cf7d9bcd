"""Edges of the file system under the engine: a full disk while a file or the resumable state is written, an
output folder inside the data folder, a file name holding a newline, the state folder of a run that saved nothing."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import torch

from helpers.bad_input import picture
from vitscope.atomic import OUTPUT_MANIFEST, atomic_path
from vitscope.data.files import ImageFiles
from vitscope.data.fingerprint import data_fingerprint
from vitscope.data.images import SkippedImageWarning
from vitscope.engine.batches import SkipLog
from vitscope.engine.state import Checkpoint

FULL = "No space left on device"


def _disk_full() -> OSError:
    """What a write to a full disk raises: an errno and no file name."""
    return OSError(errno.ENOSPC, FULL)


class _FillingFile:
    """A file object whose disk fills after ``room`` bytes."""

    def __init__(self, file, room: int = 64) -> None:
        self.file, self.room = file, room

    def write(self, data) -> int:
        self.room -= len(data)
        if self.room < 0:
            raise _disk_full()
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()


# ---------------------------------------------------------------------------------------------- atomic_path


def test_a_write_that_names_no_file_is_named_after_the_destination(tmp_path):
    target = tmp_path / "sub" / "table.csv"
    with pytest.raises(OSError) as caught, atomic_path(target) as tmp:
        tmp.write_text("half")
        raise _disk_full()
    err = caught.value
    assert (err.errno, err.strerror, err.filename) == (errno.ENOSPC, FULL, str(target))
    assert str(err) == f"[Errno 28] {FULL}: '{target}'"
    assert isinstance(err.__cause__, OSError) and err.__cause__.filename is None
    assert sorted(p.name for p in target.parent.iterdir()) == []  # the temporary file went


def test_a_write_that_names_the_temporary_file_is_named_after_the_destination(tmp_path):
    target = tmp_path / "table.csv"
    with pytest.raises(PermissionError) as caught, atomic_path(target) as tmp:
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp))
    assert caught.value.filename == str(target)


def test_a_disk_error_inside_a_writers_runtime_error_comes_back_as_itself(tmp_path):
    target = tmp_path / "weights.pt"
    with pytest.raises(OSError) as caught, atomic_path(target) as tmp, open(tmp, "wb") as f:
        torch.save({"w": torch.zeros(64)}, _FillingFile(f))  # torch's zip writer: RuntimeError "unexpected pos"
    assert not isinstance(caught.value, RuntimeError)
    assert (caught.value.errno, caught.value.filename) == (errno.ENOSPC, str(target))
    assert not list(tmp_path.iterdir())


def test_other_errors_of_a_write_pass_unchanged(tmp_path):
    named = FileNotFoundError(errno.ENOENT, "No such file or directory", str(tmp_path / "elsewhere"))
    for raised in (ValueError("bad value"), RuntimeError("not the disk"), named):
        with pytest.raises(type(raised)) as caught, atomic_path(tmp_path / "x.txt"):
            raise raised
        assert caught.value is raised


# ---------------------------------------------------------------------------------------------- the state file


def test_a_full_disk_while_the_state_is_saved_names_the_state_file(tmp_path, monkeypatch):
    path = tmp_path / ".vitscope-state" / "tiny-vit.pt"
    checkpoint = Checkpoint(path, {"run": 1})
    checkpoint.save([], position=4, seen=4, skipped=[])
    whole = path.read_bytes()
    save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f, *a, **k: save(obj, _FillingFile(f), *a, **k))
    with pytest.raises(OSError) as caught:
        checkpoint.save([], position=8, seen=8, skipped=[])
    monkeypatch.undo()
    assert not isinstance(caught.value, RuntimeError)
    assert str(caught.value) == f"[Errno 28] {FULL}: '{path}'"
    assert path.read_bytes() == whole  # the last whole state stays
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary file, no rows folder
    assert Checkpoint(path, {"run": 1}).restore([]).position == 4


def test_a_full_disk_at_the_state_files_fsync_names_the_state_file(tmp_path, monkeypatch):
    path = tmp_path / "state.pt"
    def fsync(fd: int) -> None:
        raise _disk_full()

    monkeypatch.setattr("vitscope.engine.state.os.fsync", fsync)
    with pytest.raises(OSError) as caught:
        Checkpoint(path, {"run": 1}).save([], position=1, seen=1, skipped=[])
    assert caught.value.filename == str(path) and not list(tmp_path.iterdir())


def test_a_run_that_saves_no_state_leaves_no_state_folder(tmp_path):
    folder = tmp_path / "out" / ".vitscope-state"
    with pytest.raises(ValueError), Checkpoint(folder / "run.pt", {"run": 1}).rows_beside():
        raise ValueError("a refused image under --strict")
    assert not folder.exists() and (tmp_path / "out").is_dir()


def test_a_saved_state_and_a_folder_that_was_there_stay(tmp_path):
    checkpoint = Checkpoint(tmp_path / "made" / "run.pt", {"run": 1})
    with checkpoint.rows_beside():
        checkpoint.save([], position=1, seen=1, skipped=[])
    assert checkpoint.path.is_file()
    (tmp_path / "mine").mkdir()
    with Checkpoint(tmp_path / "mine" / "run.pt", {"run": 1}).rows_beside():
        pass
    assert (tmp_path / "mine").is_dir()


# ---------------------------------------------------------------------------------------------- skipped images


def test_a_skipped_image_whose_name_holds_a_newline_is_one_warning_line():
    with pytest.warns(SkippedImageWarning) as caught:
        SkipLog().add("/data/bad\nname.png", "cannot identify image file")
    (message,) = [str(w.message) for w in caught]
    assert message == "skipping image: cannot read /data/bad name.png: cannot identify image file"


# ---------------------------------------------------------------------------------------------- folder scans


def _outputs(folder: Path, files: list[str], manifest: str | None = None) -> None:
    """What a run writes into ``folder``: figures and a results file, and the manifest listing them."""
    for rel in files:
        if rel.endswith(".png"):
            picture(folder / rel)
        else:
            (folder / rel).write_text("{}")
    (folder / OUTPUT_MANIFEST).write_text(manifest if manifest is not None else json.dumps({"files": files}))


def _names(data: Path) -> list[str]:
    return [Path(p).relative_to(data).as_posix() for p in ImageFiles(data).paths]


@pytest.fixture
def data(tmp_path) -> Path:
    for rel in ("b.png", "a.png", "zoo/c.jpg", "Out/d.png"):
        picture(tmp_path / "dd" / rel)
    return tmp_path / "dd"


def test_an_output_folder_inside_the_data_folder_is_not_read_as_images(data):
    before = data_fingerprint(ImageFiles(data))
    _outputs(data / "out", ["figures/maps_image0.png", "figures/maps_mean.png", "results.json"])
    picture(data / "out" / "figures" / "mine.png")  # the user's own file there is data
    assert _names(data) == ["Out/d.png", "a.png", "b.png", "out/figures/mine.png", "zoo/c.jpg"]
    (data / "out" / "figures" / "mine.png").unlink()
    assert data_fingerprint(ImageFiles(data)) == before  # the same images: the same fingerprint


def test_the_data_folder_as_its_own_output_folder_keeps_its_images(data):
    _outputs(data, ["figures/maps_mean.png", "report.html"])
    assert _names(data) == ["Out/d.png", "a.png", "b.png", "zoo/c.jpg"]


@pytest.mark.parametrize("manifest", ["not json", "[1]", '{"files": "figures/maps_mean.png"}', '{"other": []}'])
def test_a_file_that_is_no_output_manifest_changes_nothing(data, manifest):
    _outputs(data, ["figures/maps_mean.png"], manifest)
    assert _names(data) == ["Out/d.png", "a.png", "b.png", "figures/maps_mean.png", "zoo/c.jpg"]


def test_a_manifest_names_files_of_its_own_folder_only(data):
    outside = str((data / "a.png").resolve())
    _outputs(data / "out", ["figures/f.png"], json.dumps({"files": ["figures/f.png", outside, "../b.png"]}))
    picture(data / "out" / "figures" / "f.png")
    assert _names(data) == ["Out/d.png", "a.png", "b.png", "zoo/c.jpg"]


def test_rerunning_into_an_output_folder_inside_the_data_folder_reads_the_same_images(tmp_path):
    from helpers.cli import cli

    data = tmp_path / "dd"
    picture(data / "good.png")
    docs = []
    for _ in range(2):  # the first run's figures are in dd/out/figures when the second scans dd
        run = cli("analyze", "-m", "tiny-vit", "-d", str(data), "-o", str(data / "out"), "-a", "cls_attention_maps")
        assert run.returncode == 0, run.stderr
        docs.append(json.loads((data / "out" / "results.json").read_text())["data"])
    assert list((data / "out" / "figures").glob("*.png"))
    assert [d["num_files"] for d in docs] == [1, 1] and docs[0]["fingerprint"] == docs[1]["fingerprint"]


@pytest.mark.parametrize("out_name", ["out", None])
def test_an_output_folder_inside_class_folders_is_no_class(tmp_path, out_name) -> None:
    """ROOT::imagefolder read an --out inside the data (or the data folder itself as --out) as classes."""
    import numpy as np
    from PIL import Image

    import vitscope
    from vitscope.data.formats.imagefolder import ImageFolderDataset

    root = tmp_path / "data"
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(np.full((24, 24, 3), 40 * i, dtype=np.uint8)).save(root / name / f"{i}.png")
    out = root / out_name if out_name else root
    for _ in range(2):  # the second run reads the data beside the first run's outputs
        vitscope.analyze("tiny-vit", f"{root}::imagefolder", "attention_stats", out=out, workers=0, progress=False)
        data = ImageFolderDataset(root)
        assert data.classes == ["cat", "dog"] and len(data) == 6


def test_only_the_listed_files_and_readable_manifests_leave_class_folders(tmp_path) -> None:
    """An old manifest listing figures/x.png dropped a real class named figures; an empty file named like a manifest
    dropped its class."""
    import numpy as np
    from PIL import Image

    from vitscope.atomic import OUTPUT_MANIFEST
    from vitscope.data.formats.imagefolder import ImageFolderDataset

    root = tmp_path / "data"
    for name in ("figures", "dog", "cat"):
        (root / name).mkdir(parents=True)
        for stem in ("a", "b"):
            Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(root / name / f"{stem}.png")
    (root / OUTPUT_MANIFEST).write_text('{"files": ["figures/x.png", "figures/a.png"]}')
    (root / "cat" / OUTPUT_MANIFEST).write_text("")
    data = ImageFolderDataset(root)
    assert data.classes == ["cat", "dog", "figures"]
    assert sorted(p.relative_to(root).as_posix() for p, _ in data.samples) == [
        "cat/a.png", "cat/b.png", "dog/a.png", "dog/b.png", "figures/b.png"]
