"""What a killed writer leaves (temporary files and staging folders named with its process id) is deleted by the
next run that writes there: ``vitscope synth``, a feature cache's commit, SAE training, ``zoo build``; a plain
folder of images never reads such a file as an image; an interrupted removal never leaves a damaged cache entry."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitscope.atomic import remove_leftovers, remove_leftovers_under
from vitscope.cache import FeatureCache, RowStore


@pytest.fixture(scope="module")
def dead_pid() -> int:
    """The id of a process that has ended (reaped: no other process has had time to take its id)."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


def _plant(folder: Path, *pids: int) -> list[Path]:
    """A temporary image of each of ``pids`` in ``folder``, as :func:`vitscope.atomic.atomic_path` names them."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f".000004.vitscope-{pid}.tmp.jpg" for pid in pids]
    for path in paths:
        path.write_bytes(b"half an image")
    return paths


def test_a_tree_is_cleaned_at_every_depth_and_a_live_writers_files_are_kept(tmp_path, dead_pid) -> None:
    live = os.getppid()
    [dead_top] = _plant(tmp_path, dead_pid)
    dead_deep, live_deep = _plant(tmp_path / "a" / "b", dead_pid, live)
    staging = tmp_path / "a" / f".vitscope-staging-{dead_pid}-0a1b"
    (staging / "inner").mkdir(parents=True)
    _plant(staging / "inner", dead_pid)
    removed = remove_leftovers_under(tmp_path)
    assert sorted(removed) == sorted([dead_top.name, f"a/b/{dead_deep.name}", f"a/{staging.name}"])
    assert live_deep.is_file() and not staging.exists()
    assert remove_leftovers_under(tmp_path / "missing") == []


def test_names_kept_are_kept_even_of_a_stale_process(tmp_path) -> None:
    mine = [tmp_path / f".vitscope-staging-{os.getpid()}-{token}" for token in ("aa", "bb")]
    for path in mine:
        path.mkdir()
    assert remove_leftovers(tmp_path, stale_pids=frozenset({os.getpid()}), keep={mine[0].name}) == [mine[1].name]
    assert mine[0].is_dir()


def test_a_folder_of_images_skips_hidden_files_and_folders(tmp_path, dead_pid) -> None:
    from vitscope.data.files import ImageFiles

    for name in ("images/000001.jpg", "images/000002.jpg", ".thumbs/000001.jpg"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (4, 4)).save(tmp_path / name)
    _plant(tmp_path / "images", dead_pid)
    (tmp_path / "images" / "._000001.jpg").write_bytes(b"macOS resource fork")
    files = ImageFiles(tmp_path)
    assert [Path(p).relative_to(tmp_path).as_posix() for p in files.paths] == ["images/000001.jpg",
                                                                               "images/000002.jpg"]


def test_synth_removes_a_killed_runs_temporary_images(tmp_path, dead_pid) -> None:
    from vitscope.data.synthetic.write import synthesize

    [dead] = _plant(tmp_path / "world" / "images", dead_pid)
    [live] = _plant(tmp_path / "world" / "images", os.getppid())
    synthesize(tmp_path / "world", "list", n=2, size=16, seed=0)
    assert not dead.exists() and live.is_file()


def _store(n: int = 4) -> RowStore:
    store = RowStore()
    store.append({"index": np.arange(n), "block0": np.ones((n, 3), np.float32)})
    return store


def test_a_commit_removes_what_killed_commits_left_in_tmp(tmp_path, dead_pid) -> None:
    cache = FeatureCache(tmp_path)
    tmp = tmp_path / "tmp"
    killed = tmp / f".vitscope-staging-{dead_pid}-0a1b"
    killed.mkdir(parents=True)
    (killed / "block0.npy").write_bytes(b"a whole copy of the features")
    restarted = tmp / f".vitscope-staging-{os.getpid()}-0c1d"  # a container restarts under the same id
    restarted.mkdir()
    running = tmp / f".vitscope-staging-{os.getppid()}-0e1f"  # another process sharing the cache
    running.mkdir()
    entry = cache.commit("ab" * 8, _store(), {})
    assert len(entry) == 4 and sorted(p.name for p in tmp.iterdir()) == [running.name]


@pytest.mark.parametrize("how", ["remove", "evict"])
def test_a_removal_killed_midway_leaves_no_entry_get_would_serve(tmp_path, monkeypatch, how) -> None:
    import vitscope.cache.feature_cache as feature_cache

    cache = FeatureCache(tmp_path, max_bytes=1)
    key = "cd" * 8
    cache.commit(key, _store(), {}, evict=False)

    def killed_midway(path, ignore_errors=False):  # one column gone, meta.json not yet, then the kill
        (Path(path) / "block0.npy").unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(feature_cache.shutil, "rmtree", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        cache.remove(key) if how == "remove" else cache.evict()
    monkeypatch.undo()
    assert cache.get(key) is None and cache.keys() == []
    cache.commit("ef" * 8, _store(), {}, evict=False)  # the next commit deletes the half-deleted folder
    assert list((tmp_path / "tmp").iterdir()) == []


class Started(Exception):
    """Raised where a training would begin: what it cleaned before is what a test looks at."""


def _started(*args: object) -> None:
    raise Started


def test_sae_training_starts_by_removing_a_killed_runs_files(tmp_path, monkeypatch, dead_pid) -> None:
    import vitscope.sae.training as training
    from vitscope.models.wrap import build_tiny_vit

    image = tmp_path / "image.png"
    Image.new("RGB", (32, 32)).save(image)
    out = tmp_path / "sae"
    dead = [out / f".sae_weights.vitscope-{dead_pid}.tmp.safetensors",
            out / ".training" / f".training_state.vitscope-{dead_pid}.tmp.pt"]
    live = out / f".sae_weights.vitscope-{os.getppid()}.tmp.safetensors"
    for path in (*dead, live):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    monkeypatch.setattr(training, "_saved", _started)  # the training proper is not needed
    backbone = build_tiny_vit("t", image_size=32, depth=2, embed_dim=32, num_heads=2)
    with pytest.raises(Started):
        training.train(backbone, "blocks.1.resid_post", [str(image)], out=out, device="cpu")
    assert not any(p.exists() for p in dead) and live.is_file()


def test_zoo_build_starts_by_removing_a_killed_builds_files(tmp_path, monkeypatch, dead_pid) -> None:
    import vitscope.zoo.build as zoo_build

    dead = [tmp_path / f".tiny-vit-sup.vitscope-{dead_pid}.tmp.safetensors",
            tmp_path / "cards" / f".tiny-vit-sup.vitscope-{dead_pid}.tmp.md"]
    live = tmp_path / f".other.vitscope-{os.getppid()}.tmp.safetensors"  # a parallel build's
    for path in (*dead, live):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    monkeypatch.setattr(zoo_build, "_build", lambda *args: {"built": True})  # the training proper is not needed
    assert zoo_build.build("tiny-vit-sup", tmp_path) == {"built": True}
    assert not any(p.exists() for p in dead) and live.is_file()


def test_training_removes_a_killed_runs_state_file_from_its_checkpoint_folder(tmp_path, monkeypatch,
                                                                              dead_pid) -> None:
    import vitscope.train.loop as loop
    from vitscope.models.wrap import build_tiny_vit
    from vitscope.train.data import synthetic_split
    from vitscope.train.supervised import SupervisedConfig, SupervisedRecipe

    stem, suffix = os.path.splitext(loop.CHECKPOINT_NAME)
    dead = tmp_path / f".{stem}.vitscope-{dead_pid}.tmp{suffix}"
    dead.write_bytes(b"14.8 MB of half a state")
    live = tmp_path / f".{stem}.vitscope-{os.getppid()}.tmp{suffix}"
    live.write_bytes(b"x")
    monkeypatch.setattr(loop, "_resumable", _started)  # the training proper is not needed
    recipe = SupervisedRecipe(build_tiny_vit("t", image_size=32, depth=1, embed_dim=16, num_heads=2,
                                             num_classes=4), SupervisedConfig(warmup=1))
    with pytest.raises(Started):
        loop.fit(recipe, synthetic_split(4, seed=0, size=32, num_classes=4), loop.LoopConfig(
            steps=1, batch_size=4, seed=0, checkpoint_dir=tmp_path, progress=False))
    assert not dead.exists() and live.is_file()
