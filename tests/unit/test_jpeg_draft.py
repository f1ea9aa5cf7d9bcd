"""JPEGs decoded at reduced DCT scales (``jpeg_draft``): the scale chosen, what a run records, where it is refused."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

import vitscope
from vitscope.data.images import decode_rgb, jpeg_drafting, load_rgb
from vitscope.engine.decoding import decoding
from vitscope.models.views import TiledView


def _jpeg(path, width: int, height: int, orientation: int | None = None) -> None:
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x * 255 // width, y * 255 // height, (x + y) % 256], axis=-1).astype(np.uint8)
    image = Image.fromarray(pixels)
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    image.save(path, quality=92, exif=exif.tobytes())


def test_the_least_scale_that_covers_the_resize_is_chosen(tmp_path) -> None:
    _jpeg(tmp_path / "big.jpg", 1600, 1200)
    full = load_rgb(tmp_path / "big.jpg")
    with jpeg_drafting(lambda hw: (256, 256 * hw[1] // hw[0])):  # short side to 256
        drafted = load_rgb(tmp_path / "big.jpg")
    assert full.size == (1600, 1200)
    assert drafted.size == (400, 300)  # 1/4: 1/8 would give 150 rows, under 256
    small = np.asarray(full.resize((400, 300), Image.BILINEAR), dtype=float)
    assert np.abs(np.asarray(drafted, dtype=float) - small).mean() < 4  # the same picture, another filter
    with jpeg_drafting(lambda hw: (1000, 1000)):
        assert load_rgb(tmp_path / "big.jpg").size == (1600, 1200)  # no scale covers it: full size


def test_pngs_and_the_default_decode_in_full(tmp_path) -> None:
    Image.new("RGB", (1600, 1200), (10, 20, 30)).save(tmp_path / "big.png")
    with jpeg_drafting(lambda hw: (100, 100)):
        assert load_rgb(tmp_path / "big.png").size == (1600, 1200)
    _jpeg(tmp_path / "big.jpg", 1600, 1200)
    assert decode_rgb(io.BytesIO((tmp_path / "big.jpg").read_bytes()), "row 3").size == (1600, 1200)


def test_an_image_turned_by_its_exif_is_drafted_by_its_turned_size(tmp_path) -> None:
    _jpeg(tmp_path / "turned.jpg", 1600, 800, orientation=6)  # shown as 800 wide, 1600 high
    asked = []

    def target(hw):
        asked.append(hw)
        return (300, 150)

    with jpeg_drafting(target):
        image = load_rgb(tmp_path / "turned.jpg")
    assert asked == [(1600, 800)]
    assert image.size == (200, 400)  # 1/4 of the turned size: 1/8 would be 100 wide, under 150


def test_a_run_records_the_decoding_and_refuses_it_where_the_size_is_unknown(tmp_path) -> None:
    for i in range(4):
        (tmp_path / "data").mkdir(exist_ok=True)
        _jpeg(tmp_path / "data" / f"{i}.jpg", 1280, 960)
    backbone = vitscope.load_model("tiny-vit-sup")
    runs = {draft: vitscope.run(backbone, str(tmp_path / "data"), ["attention_distance"], batch_size=2,
                                progress=False, workers=0, jpeg_draft=draft) for draft in (False, True)}
    assert runs[False].data["decode"] == "full" and runs[True].data["decode"] == "jpeg_draft"
    a, b = (runs[d]["attention_distance"]["distance"] for d in (False, True))
    assert not np.array_equal(a.numpy(), b.numpy())  # other pixels, other numbers
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0.05)
    workers = vitscope.run(backbone, str(tmp_path / "data"), ["attention_distance"], batch_size=2, progress=False,
                           workers=2, jpeg_draft=True)  # forked workers decode the same way
    assert np.array_equal(workers["attention_distance"]["distance"].numpy(), b.numpy())
    with pytest.raises(ValueError, match="jpeg_draft needs the model's own resize"):
        decoding(backbone, True, TiledView(scale=2))


def test_the_command_line_records_it_in_results_json(tmp_path) -> None:
    from typer.testing import CliRunner

    from vitscope.cli.main import app

    (tmp_path / "data").mkdir()
    for i in range(2):
        _jpeg(tmp_path / "data" / f"{i}.jpg", 640, 480)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["analyze", "--model", "tiny-vit-sup", "--data", str(tmp_path / "data"),
                                      "--analyses", "attention_distance", "--out", str(out), "--jpeg-draft",
                                      "--workers", "0"])
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "results.json").read_text())
    assert saved["data"]["decode"] == "jpeg_draft" and saved["config"]["jpeg_draft"] is True


def test_drafting_holds_in_its_own_thread_and_in_the_loading_thread_it_starts(tmp_path) -> None:
    import threading

    from vitscope.engine.batches import _in_a_thread

    _jpeg(tmp_path / "big.jpg", 1600, 1200)
    sizes: dict[str, tuple[int, int]] = {}
    inside, drafted = threading.Event(), threading.Event()

    def drafting() -> None:
        with jpeg_drafting(lambda hw: (150, 200)):
            inside.set()
            sizes["drafting"] = load_rgb(tmp_path / "big.jpg").size
            # the engine's loading thread decodes in a copy of this context
            sizes["its loader"] = next(_in_a_thread(_Jobs(tmp_path / "big.jpg"))).size
            drafted.wait(10)

    def plain() -> None:
        inside.wait(10)  # while the other thread is inside jpeg_drafting
        sizes["plain"] = load_rgb(tmp_path / "big.jpg").size
        drafted.set()

    threads = [threading.Thread(target=drafting), threading.Thread(target=plain)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert sizes == {"drafting": (200, 150), "its loader": (200, 150), "plain": (1600, 1200)}


class _Jobs:
    """One job that decodes one file, shaped like the engine's batch jobs."""

    def __init__(self, path) -> None:
        self.path = path

    def __len__(self) -> int:
        return 1

    def __getitem__(self, k: int):
        return load_rgb(self.path)


def test_a_drafted_jpeg_keeps_the_grid_and_crop_of_its_full_decode(tmp_path) -> None:
    """Under a token budget the grid follows the image's aspect ratio: a 133 x 100 JPEG drafted to 1/2 is 67 x 50,
    whose own rule gives a 5 x 3 grid where the full image gives 4 x 4. Geometry follows the full decode's size."""
    from helpers.hf_factories import make
    from vitscope import wrap
    from vitscope.data.images import full_size
    from vitscope.models.input_size import keeping_aspect
    from vitscope.models.preprocess import aspect_size, resample_filter, resize_crop

    backbone = keeping_aspect(wrap(make("dinov2"), name="dinov2"))  # patches of 8, at most 16
    (tmp_path / "data").mkdir()
    _jpeg(tmp_path / "data" / "wide.jpg", 133, 100)
    full = load_rgb(tmp_path / "data" / "wide.jpg")
    with decoding(backbone, True):
        drafted = load_rgb(tmp_path / "data" / "wide.jpg")
    assert drafted.size == (67, 50) and full_size(drafted) == (100, 133) and full_size(full) == (100, 133)
    assert aspect_size((50, 67), 8, 16) == (24, 40)  # what the drafted size alone would give
    assert resize_crop(drafted, backbone.spec).size == resize_crop(full, backbone.spec).size == (32, 32)
    runs = {draft: vitscope.run(backbone, str(tmp_path / "data"), ["attention_distance"], batch_size=1,
                                progress=False, workers=0, jpeg_draft=draft) for draft in (False, True)}
    assert runs[True].grids == runs[False].grids == {"4x4": 1}
    # a model with one input size: a 307 x 300 JPEG is resized to 65 x 64 and cropped from column 0; drafted to
    # 77 x 75, its own size would give 66 x 64 from column 1
    square = vitscope.load_model("tiny-vit-sup")
    _jpeg(tmp_path / "square.jpg", 307, 300)
    with decoding(square, True):
        drafted = load_rgb(tmp_path / "square.jpg")
    assert drafted.size == (77, 75) and full_size(drafted) == (300, 307)
    expected = drafted.resize((65, 64), resample_filter(square.spec.interpolation)).crop((0, 0, 64, 64))
    assert np.array_equal(np.asarray(resize_crop(drafted, square.spec)), np.asarray(expected))


def test_masks_of_a_drafted_jpeg_are_checked_against_its_full_size(tmp_path) -> None:
    """COCO masks cover the full image; a JPEG drafted to a quarter of it is still read (it was skipped)."""
    from vitscope.data.synthetic.write import synthesize

    root = synthesize(tmp_path / "coco", "coco", n=3, size=256, seed=0)
    assert sorted(p.suffix for p in (root / "val2017").iterdir()) == [".jpg"] * 3
    runs = {draft: vitscope.run(vitscope.load_model("tiny-vit"), f"{root}::coco", ["saliency_iou"], batch_size=3,
                                progress=False, workers=0, jpeg_draft=draft) for draft in (False, True)}
    assert [(r.num_images, len(r.skipped)) for r in runs.values()] == [(3, 0), (3, 0)]
