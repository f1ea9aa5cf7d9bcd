"""The output folder check of commands that work before they write."""

from __future__ import annotations

from vitscope.cli.paths import writable_folder


def test_a_refused_run_leaves_no_folder_but_torchrun_processes_keep_the_one_they_share(tmp_path, monkeypatch):
    alone = tmp_path / "a" / "out"
    writable_folder("--out", alone, keep=False)
    assert not (tmp_path / "a").exists()  # the folders the check made are gone again
    monkeypatch.setenv("WORLD_SIZE", "2")  # another process may be checking, or writing into, the same folder
    shared = tmp_path / "b" / "out"
    writable_folder("--out", shared, keep=False)
    assert shared.is_dir()
