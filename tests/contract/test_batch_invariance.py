"""Every registered analysis (and the one docs/extending.md shows) gives the same numbers whatever the batch
size, process split and resume point.

A real pass (the engine, the tiny zoo's classifiers, a synthetic COCO world with labels and masks) of every
analysis at ``-b`` 16, 7, 3 and 1, and a run stopped after two batches and resumed with another batch size, must
agree to 1e-5 of each quantity's scale: only the forward pass's own float32 rounding, which differs between
batch sizes, may move a number. Minibatch statistics (CKA, residual CKA) get minibatches of 4 images here so
that minibatches both complete inside a batch and straddle batches. Process splits are the random-split merge
property of tests/contract/test_analysis_contract.py and the two-process runs of tests/e2e/test_distributed.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

import vitscope
from helpers.doc_examples import doc_analyses, registered
from vitscope.analyses import ANALYSES
from vitscope.data.synthetic.write import synthesize
from vitscope.engine.state import STOP_AFTER_ENV

try:  # pytest's default "prepend" import mode puts this folder on sys.path
    from fake_records import construct
except ImportError:  # pragma: no cover - when tests/ is a package
    from tests.contract.fake_records import construct

#: parameters that keep the slow analyses quick; batching is what is tested, not these choices
LIGHT: dict[str, dict[str, Any]] = {
    "cka": {"batch": 4},
    "residual_cka": {"batch": 4},
    "interrelation_masking": {"ratios": (0.1, 0.5)},
    "frequency_filtering": {"fractions": (0.1, 0.5)},
    "linear_probe": {"epochs": 5},
    "head_importance": {"blocks": (5,), "reference_images": 4},
}
MODELS = {"vit": "tiny-vit-sup", "cnn": "tiny-resnet-sup"}
BATCH_SIZES = (16, 7, 3, 1)  # 7: batches of 4 images or more that cut minibatches
RTOL = 1e-5


#: the analyses docs/extending.md registers (run from the page as written): batching moves none of their numbers
DOCUMENTED = doc_analyses()


@pytest.fixture(autouse=True, scope="module")
def documented_analyses_registered():
    with registered(*DOCUMENTED.values()):
        yield


def analyses_for(backbone) -> list:
    made = [construct(name, backbone.spec, **LIGHT.get(name, {})) for name in sorted(ANALYSES)]
    return [a for a in made if a.supports(backbone.spec)]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = synthesize(tmp_path_factory.mktemp("batching") / "world", "coco", n=12, size=64, seed=3)
    return f"{root}::coco"


@pytest.fixture(scope="module")
def runs(world: str) -> dict[str, dict[int, Any]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: the same reduction order in every run
    try:
        out = {}
        for kind, model in MODELS.items():
            backbone = vitscope.load_model(model)
            out[kind] = {b: vitscope.run(backbone, world, analyses_for(backbone), batch_size=b, progress=False)
                         for b in BATCH_SIZES}
        return out
    finally:
        torch.set_num_threads(threads)


def differences(got: Any, want: Any, path: str) -> list[str]:
    """Where two result trees differ beyond RTOL of each quantity's scale (NaN equals NaN)."""
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            return [f"{path}: {getattr(got, 'shape', got)} vs {tuple(want.shape)}"]
        if not want.is_floating_point():
            return [] if torch.equal(got, want) else [f"{path}: {int((got != want).sum())} entries differ"]
        a, b = got.double(), want.double()
        both_nan = torch.isnan(a) & torch.isnan(b)
        finite = torch.isfinite(b)
        scale = b[finite].abs().max().item() if finite.any() else 0.0
        off = ((a - b).abs() > RTOL * scale + 1e-9) & ~both_nan & finite
        same_inf = (a[~finite & ~both_nan] == b[~finite & ~both_nan]).all()
        if off.any() or not same_inf:
            worst = (a - b)[off].abs().max().item() if off.any() else "inf"
            return [f"{path}: off by up to {worst} (scale {scale:.3g})"]
        return []
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            return [f"{path}: keys {sorted(map(str, got))} vs {sorted(map(str, want))}"]
        return [d for k in want for d in differences(got[k], want[k], f"{path}.{k}")]
    if isinstance(want, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(want):
            return [f"{path}: length {len(got)} vs {len(want)}"]
        return [d for i, (x, y) in enumerate(zip(got, want)) for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(want, float) and isinstance(got, (int, float)):
        if math.isnan(want) and math.isnan(got):
            return []
        return [] if math.isclose(got, want, rel_tol=RTOL, abs_tol=1e-9) else [f"{path}: {got!r} vs {want!r}"]
    return [] if got == want else [f"{path}: {got!r} vs {want!r}"]


def result_differences(got, want) -> list[str]:
    found = [f"analyses {sorted(got)} vs {sorted(want)}"] if sorted(got) != sorted(want) else []
    for name in want:
        found += differences(got[name].tensors, want[name].tensors, f"{name}.tensors")
        found += differences(got[name].meta, want[name].meta, f"{name}.meta")
    return found


@pytest.mark.parametrize("kind", sorted(MODELS))
@pytest.mark.parametrize("batch_size", [7, 3, 1])
def test_every_analysis_gives_the_numbers_of_batch_16(runs, kind: str, batch_size: int) -> None:
    found = result_differences(runs[kind][batch_size], runs[kind][16])
    assert not found, f"-b {batch_size} moved:\n" + "\n".join(found)


def test_every_registered_analysis_ran(runs) -> None:
    ran = {name for by_size in runs.values() for name in by_size[16]}
    assert ran == set(ANALYSES) and set(DOCUMENTED) <= ran
    empty = [f"{kind}: {name}" for kind, by_size in runs.items() for name, r in by_size[16].items() if not r.tensors]
    assert not empty, f"no numbers to compare (the data must suit every analysis): {empty}"
    cka = runs["vit"][16]["cka"]
    assert cka.meta["batch"] == 4 and cka.meta["num_images"] == 12 and "cka" in cka.tensors


def test_a_run_resumed_with_another_batch_size_gives_the_same_numbers(runs, world: str, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    backbone = vitscope.load_model(MODELS["vit"])
    state = tmp_path / "state.pt"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        monkeypatch.setenv(STOP_AFTER_ENV, "2")
        with pytest.raises(KeyboardInterrupt):
            vitscope.run(backbone, world, analyses_for(backbone), batch_size=3, progress=False, resume=state)
        monkeypatch.delenv(STOP_AFTER_ENV)
        resumed = vitscope.run(backbone, world, analyses_for(backbone), batch_size=5, progress=False, resume=state)
    finally:
        torch.set_num_threads(threads)
    assert resumed.resumed_images == 6  # two batches of 3 came from the state file
    found = result_differences(resumed, runs["vit"][16])
    assert not found, "resumed at -b 5 after 6 images at -b 3 moved:\n" + "\n".join(found)


@pytest.fixture(scope="module")
def world_with_an_unlabelled_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The world with image 1's annotations removed, as COCO ships images nobody annotated."""
    root = synthesize(tmp_path_factory.mktemp("unlabelled") / "world", "coco", n=12, size=64, seed=3)
    annotations = root / "annotations" / "instances_val2017.json"
    doc = json.loads(annotations.read_text())
    gone = sorted(image["id"] for image in doc["images"])[1]
    doc["annotations"] = [a for a in doc["annotations"] if a["image_id"] != gone]
    annotations.write_text(json.dumps(doc))
    return f"{root}::coco"


def test_an_image_without_a_label_is_left_out_alone_whatever_the_batch(world_with_an_unlabelled_image: str) -> None:
    """Probes and compare's pooled features drop the unlabelled image only, not the batch it came in; the
    masking analyses, which score every image's prediction, refuse the data before the pass."""
    from vitscope.comparison.pooled import PooledFeatures

    backbone = vitscope.load_model(MODELS["vit"])

    def made() -> list:
        return [ANALYSES[n](**LIGHT.get(n, {})) for n in ("knn_probe", "linear_probe", "clustering")] + \
            [PooledFeatures()]

    got = {b: vitscope.run(backbone, world_with_an_unlabelled_image, made(), batch_size=b, progress=False)
           for b in (16, 3)}
    found = result_differences(got[3], got[16])
    assert not found, "-b 3 moved:\n" + "\n".join(found)
    assert got[16]["clustering"].meta["unlabelled_images"] == 1 and got[16]["clustering"].meta["num_rows"] == 11
    assert int((got[16]["pooled_features"].tensors["label"] < 0).sum()) == 1
    with pytest.raises(ValueError, match="1 of 12 images of .* have no label"):
        vitscope.run(backbone, world_with_an_unlabelled_image, [ANALYSES["foreground_masking"]()], progress=False)


def _exactly(got: Any, want: Any) -> bool:
    if isinstance(want, torch.Tensor):
        return isinstance(got, torch.Tensor) and got.shape == want.shape and torch.equal(got.nan_to_num(-7.0),
                                                                                         want.nan_to_num(-7.0))
    if isinstance(want, dict):
        return isinstance(got, dict) and set(got) == set(want) and all(_exactly(got[k], want[k]) for k in want)
    if isinstance(want, (list, tuple)):
        return isinstance(got, (list, tuple)) and len(got) == len(want) and all(map(_exactly, got, want))
    if isinstance(want, float) and math.isnan(want):
        return isinstance(got, float) and math.isnan(got)
    return got == want


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_images_decoded_in_worker_processes_give_the_same_bits(runs, world: str, kind: str) -> None:
    """``workers=2``: two forked processes decode, preprocess and make ground truth, batches ahead; the batches,
    and so every number, are those of the one loading thread (bit for bit at the same batch size)."""
    backbone = vitscope.load_model(MODELS[kind])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        got = vitscope.run(backbone, world, analyses_for(backbone), batch_size=7, progress=False, workers=2)
    finally:
        torch.set_num_threads(threads)
    want = runs[kind][7]
    assert got.workers == 2 and want.workers == 0
    assert sorted(got) == sorted(want) and got.num_images == want.num_images
    moved = [name for name in want if not (_exactly(got[name].tensors, want[name].tensors)
                                           and _exactly(got[name].meta, want[name].meta))]
    assert not moved, f"decoding in workers moved: {moved}"


@pytest.fixture(scope="module")
def mixed_world(tmp_path_factory: pytest.TempPathFactory) -> str:
    from helpers.mixed_world import stretched_coco

    return stretched_coco(tmp_path_factory.mktemp("mixed") / "world")


#: what images of several grids change: the analyses that flatten every token of an image pool them instead
MIXED = {**LIGHT, "cka": {"batch": 4, "tokens": "spatial_mean"}, "residual_cka": {"batch": 4, "tokens": "spatial_mean"}}


def test_images_of_several_grids_give_the_same_numbers_whatever_the_batch(mixed_world: str) -> None:
    """``--keep-aspect``: each image at its own grid, batches split by grid; every registered analysis runs (per
    image, or per grid) and -b 3 (grids interleaved inside batches, groups of one image) equals -b 16."""
    from vitscope.models.input_size import keeping_aspect

    backbone = keeping_aspect(vitscope.load_model(MODELS["vit"]))
    made = lambda: [a for a in (construct(n, backbone.spec, **MIXED.get(n, {})) for n in sorted(ANALYSES))
                    if a.supports(backbone.spec)]
    refused = {name: construct(name, backbone.spec).why_unsupported(backbone.spec) for name in ANALYSES}
    assert {a.name for a in made()} == set(ANALYSES) - {"head_importance"}, refused  # per-token controls: one grid
    assert "token grids of their own" in refused["head_importance"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        got = {b: vitscope.run(backbone, mixed_world, made(), batch_size=b, progress=False, workers=0)
               for b in (16, 3)}
        forked = vitscope.run(backbone, mixed_world, made(), batch_size=16, progress=False, workers=2)
    finally:
        torch.set_num_threads(threads)
    assert got[16].grids == got[3].grids == {"6x10": 4, "8x8": 4, "5x12": 2, "9x6": 2}
    assert got[16]["attention_distance"].meta["grids"] == got[16].grids
    found = result_differences(got[3], got[16])
    assert not found, "-b 3 moved:\n" + "\n".join(found)
    assert "@5x12" in " ".join(got[16]["cls_attention_maps"].tensors)  # a map per grid
    assert forked.workers == 1 and forked.grids == got[16].grids  # groups of one grid made in a worker (one batch)
    assert all(_exactly(forked[n].tensors, got[16][n].tensors) for n in got[16]), "workers moved a number"
    assert ANALYSES["cka"]().why_unsupported(backbone.spec).endswith("set cka.tokens=spatial_mean (or cls)")
    no_cls = dataclasses.replace(backbone.spec, prefix_kinds=(), num_prefix_tokens=0)  # SigLIP 2: no CLS to suggest
    assert ANALYSES["cka"]().why_unsupported(no_cls).endswith("set cka.tokens=spatial_mean")
