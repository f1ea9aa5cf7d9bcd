"""docs/errors.md rows at the file system's edges: a full disk while the saved state or the manifest is written, a
file name holding a newline, and what a refused ``--strict`` run leaves. Full disks are injected: the write raises
the ``OSError`` the system would (an errno, no file name)."""

from __future__ import annotations

import errno
import pathlib

import pytest
import torch

from helpers.bad_input import analyze, finished, folder_with_one_good_image, one_error, skipped, warned
from vitscope.atomic import OUTPUT_MANIFEST, temporary_path

FULL = "[Errno 28] No space left on device"


@pytest.fixture
def photos(tmp_path):
    return folder_with_one_good_image(tmp_path)


def _no_leftovers(out: pathlib.Path) -> None:
    """No temporary file, staging folder or rows folder is left in ``out``."""
    assert not [p for p in out.rglob("*") if ".tmp" in p.name or "staging" in p.name or ".rows-" in p.name]


def test_output_disk_full_while_the_state_is_saved(photos, tmp_path, monkeypatch):
    out = tmp_path / "out"
    save = torch.save

    def full(obj, f, *args, **kwargs):
        if ".vitscope-state" not in str(getattr(f, "name", "")):
            return save(obj, f, *args, **kwargs)

        class Filling:  # the disk fills after the zip writer's first bytes
            def write(self, data):
                raise OSError(errno.ENOSPC, "No space left on device")

            def flush(self):
                pass

        return save(obj, Filling(), *args, **kwargs)

    monkeypatch.setattr(torch, "save", full)
    line = one_error(analyze(photos, out), FULL)
    assert line == f"error: {FULL}: '{out / '.vitscope-state' / 'tiny-vit.pt'}'"
    _no_leftovers(out)


def test_output_disk_full_names_the_file(photos, tmp_path, monkeypatch):
    out = tmp_path / "out"
    first = finished(analyze(photos, out), out)
    write_text = pathlib.Path.write_text
    manifest = temporary_path(out / OUTPUT_MANIFEST).name

    def full(self, *args, **kwargs):
        if self.name == manifest:
            raise OSError(errno.ENOSPC, "No space left on device")  # a write names no file
        return write_text(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", full)
    line = one_error(analyze(photos, out), FULL)
    monkeypatch.undo()
    assert line == f"error: {FULL}: '{out / OUTPUT_MANIFEST}'"
    assert finished(analyze(photos, out), out)["data"] == first["data"]
    _no_leftovers(out)


def test_image_corrupt_whose_name_holds_a_newline(photos, tmp_path):
    (photos / "bad\nname.png").write_bytes(b"not an image")
    run = analyze(photos, tmp_path / "out")
    line = warned(run, "cannot identify image file")
    assert line.endswith("cannot read " + str(photos / "bad name.png") + ": cannot identify image file")
    assert skipped(finished(run, tmp_path / "out")) == {"bad\nname.png": "cannot identify image file"}


def test_image_unreadable_under_strict_leaves_no_state_folder(photos, tmp_path):
    (photos / "bad.png").write_bytes(b"not an image")
    out = tmp_path / "out"
    one_error(analyze(photos, out, "--strict"), "cannot read")
    assert list(out.iterdir()) == []  # the folder was made before the pass (it is checked first); nothing in it
