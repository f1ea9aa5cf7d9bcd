"""DAVIS 2017 conventions of the official semi-supervised evaluation: void is background, OpenCV's disk dilation."""

from __future__ import annotations

import numpy as np
import pytest

from vitscope.downstream.davis import evaluate_sequence
from vitscope.functional.video import boundary_map, davis_f


def _sequence() -> tuple[list[np.ndarray], np.ndarray]:
    truth = np.zeros((3, 12, 12), dtype=np.uint8)
    truth[:, 3:7, 3:7] = 1  # a 16-pixel object
    truth[:, 3:7, 7:9] = 255  # a void band of 8 pixels beside it
    pred = np.zeros((12, 12), dtype=np.uint8)
    pred[3:7, 3:9] = 1  # the object and the void band
    return [pred, pred, pred], truth


def test_void_counts_as_background_as_the_official_evaluation() -> None:
    preds, truth = _sequence()
    (j,), (f,) = evaluate_sequence(preds, truth)
    assert j == pytest.approx(16 / 24)  # the 8 predicted void pixels are false positives
    assert f < 1.0  # the predicted boundary runs along the void band, not the object
    (j_ignore,), (f_ignore,) = evaluate_sequence(preds, truth, void="ignore")
    assert j_ignore == 1.0 and f_ignore > f  # the masked variant: higher, as the issue measured
    with pytest.raises(ValueError, match="void must be one of background, ignore"):
        evaluate_sequence(preds, truth, void="mask")


def _official_dilation(b: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """cv2.dilate by loops: anchor at (rows // 2, cols // 2), outside the image is 0."""
    h, w = b.shape
    ay, ax = kernel.shape[0] // 2, kernel.shape[1] // 2
    out = np.zeros_like(b, dtype=bool)
    for y in range(h):
        for x in range(w):
            for i, j in np.argwhere(kernel):
                yy, xx = y + i - ay, x + j - ax
                if 0 <= yy < h and 0 <= xx < w and b[yy, xx]:
                    out[y, x] = True
                    break
    return out


@pytest.mark.parametrize("tolerance", [2.5, 3.0, 1.5])
def test_pixel_tolerances_use_the_official_disk_and_anchor(tolerance: float) -> None:
    from skimage.morphology import disk

    rng = np.random.default_rng(int(tolerance * 10))
    yy, xx = np.mgrid[0:30, 0:34]
    pred = ((yy - 14) ** 2 + (xx - 15) ** 2 < 64).astype(np.uint8)
    true = ((yy - 15 - rng.uniform(-2, 2)) ** 2 + (xx - 18) ** 2 < 60).astype(np.uint8)
    kernel = disk(tolerance).astype(bool)
    if tolerance % 1:
        assert kernel.shape[0] % 2 == 0  # fractional radius: an even kernel, whose anchor is off-centre
    bp, bt = boundary_map(pred), boundary_map(true)
    precision = (bp & _official_dilation(bt, kernel)).sum() / bp.sum()
    recall = (bt & _official_dilation(bp, kernel)).sum() / bt.sum()
    expected = 2 * precision * recall / (precision + recall)
    assert davis_f(pred, true, bound_th=tolerance) == pytest.approx(expected)


def test_probe_takes_the_void_rule_from_the_command_line(tmp_path) -> None:
    import json

    from tests.helpers.cli import cli

    from vitscope.data.synthetic.write import synthesize

    davis = synthesize(tmp_path / "davis", "davis", n=1, size=64, seed=0)
    out = tmp_path / "out"
    proc = cli("probe", "-m", "tiny-vit-metric", "-d", f"{davis}::davis", "-o", str(out), "--davis-void", "ignore",
               "-b", "8", "--blocks", "-1", "--cache", str(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "results.json").read_text())
    assert doc["analyses"]["davis"]["summary"]["void"] == "ignore"
    bad = cli("probe", "-m", "tiny-vit-metric", "-d", f"{davis}::davis", "-o", str(tmp_path / "bad"),
              "--davis-void", "mask", "--cache", str(tmp_path / "cache"))
    assert bad.returncode == 2  # bad usage
    assert bad.stderr.strip() == "error: --davis-void must be one of background, ignore, got 'mask'"
    site = cli("probe", "-m", "tiny-vit-metric", "-d", f"{davis}::davis", "-o", str(tmp_path / "site"),
               "--site", "bogus")
    assert site.returncode == 2 and "--site must be one of resid_pre, norm1" in site.stderr
