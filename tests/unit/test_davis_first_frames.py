"""DAVIS test-dev / test-challenge: only the first frame of each sequence is annotated. The reader loads it,
``probe`` propagates at one block and writes the masks as DAVIS palette PNGs, and says that no J&F was computed."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers.bad_input import one_error
from helpers.cli import cli
from vitscope.data.formats.davis import DavisDataset, read_davis_mask
from vitscope.data.formats.errors import DatasetFormatError


@pytest.fixture(scope="module")
def davis_val(tmp_path_factory) -> Path:
    from vitscope.data.synthetic.write import synthesize

    root = tmp_path_factory.mktemp("davis") / "val"
    synthesize(root, "davis", n=2, size=32, seed=0)
    return root


def _first_frames_only(davis_val: Path, to: Path) -> Path:
    root = shutil.copytree(davis_val, to)
    for seq in (root / "Annotations" / "480p").iterdir():
        for png in sorted(seq.glob("*.png"))[1:]:
            png.unlink()
    return root


def test_reader_loads_first_frame_annotations(davis_val, tmp_path):
    full, first = DavisDataset(davis_val), DavisDataset(_first_frames_only(davis_val, tmp_path / "dev"))
    assert not full.first_frame_only and first.first_frame_only
    for s in range(len(full)):
        assert first[s].frame_paths == [p.replace(str(davis_val), str(tmp_path / "dev")) for p in full[s].frame_paths]
        assert len(first[s].mask_paths) == 1 and first[s].masks().shape[0] == 1
        assert np.array_equal(first[s].masks()[0], full[s].masks()[0])


def test_a_split_mixing_both_kinds_is_refused(davis_val, tmp_path):
    root = shutil.copytree(davis_val, tmp_path / "mixed")
    seq = sorted((root / "Annotations" / "480p").iterdir())[0]
    for png in sorted(seq.glob("*.png"))[1:]:
        png.unlink()
    with pytest.raises(DatasetFormatError, match="mixes sequences annotated only on their first frame"):
        DavisDataset(root)


def test_probe_writes_palette_pngs_of_the_last_block_and_no_scores(davis_val, tmp_path):
    from vitscope import load_model
    from vitscope.downstream.davis import davis_predictions

    dev = _first_frames_only(davis_val, tmp_path / "dev")
    out = tmp_path / "out"
    result = cli("probe", "-m", "tiny-vit", "-d", f"{dev}::davis", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "no J&F" in result.stderr and "predictions/" in result.stderr
    doc = json.loads((out / "results.json").read_text())
    assert doc["davis"]["scored"] is False and doc["davis"]["block"] == 5 and doc["analyses"] == {}
    dataset = DavisDataset(dev)
    expected = davis_predictions(load_model("tiny-vit"), DavisDataset(davis_val), 5, cache=None)
    for s in range(len(dataset)):
        seq = dataset[s]
        for t, frame in enumerate(seq.frame_paths):
            rel = f"{seq.name}/{Path(frame).stem}.png"
            png = out / "predictions" / rel
            with Image.open(png) as img:
                assert img.mode == "P" and img.size == Image.open(frame).size
            mask = read_davis_mask(png)
            assert np.array_equal(mask, read_davis_mask(io.BytesIO(expected[rel])))  # same as from the full split
            if t == 0:
                assert np.array_equal(mask, seq.masks()[0])  # the given annotation
    assert doc["davis"]["frames"] == sum(len(dataset[s].frame_paths) for s in range(len(dataset)))
    html = (out / "report.html").read_text()
    assert "no J or F was computed" in html and "vitscope probe" in html
    digest = doc["data"]["fingerprint"]["digest"]
    assert len(digest) == 16 and digest in html  # the report shows what data it measured


def test_probe_on_first_frames_takes_one_block(davis_val, tmp_path):
    dev = _first_frames_only(davis_val, tmp_path / "dev")
    last = cli("probe", "-m", "tiny-vit", "-d", f"{dev}::davis", "-o", str(tmp_path / "last"), "--blocks", "-1")
    assert last.returncode == 0, last.stderr
    assert json.loads((tmp_path / "last" / "results.json").read_text())["davis"]["block"] == 5
    one_error(cli("probe", "-m", "tiny-vit", "-d", f"{dev}::davis", "-o", str(tmp_path / "out"), "--blocks", "2,3"),
              "pass --blocks with one block (got 2")
    assert not (tmp_path / "out").exists()  # refused before the folder is made


def test_a_sequence_of_frames_of_two_sizes_is_refused_naming_the_frame(davis_val, tmp_path):
    from vitscope import load_model
    from vitscope.downstream.davis import davis_predictions

    root = shutil.copytree(davis_val, tmp_path / "sizes")
    frame = sorted(next(iter(sorted((root / "JPEGImages" / "480p").iterdir()))).glob("*.jpg"))[2]
    Image.open(frame).resize((40, 24)).save(frame)
    with pytest.raises(ValueError, match=rf"frame .*{frame.name} is 40x24 but .* is 32x32; propagation needs one"):
        davis_predictions(load_model("tiny-vit"), DavisDataset(root), 5, cache=None)
