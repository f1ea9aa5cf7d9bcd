"""The shipped zoo: every model loads offline, fast, reproduces its recorded held-out score, clears the bar."""

import functools
import json
import os
import time

import pytest
import torch

import vitscope
from vitscope.zoo import heldout
from vitscope.zoo.cards import MARGIN_OVER_PIXELS, MARGIN_OVER_RANDOM, meets_bar
from vitscope.zoo.catalog import ZOO, get_entry
from vitscope.zoo.store import read_manifest, zoo_dir

MAX_BYTES = 25_000_000  # 25 MB for the issue-4 zoo
EXTRA_MAX_BYTES = 5_000_000  # issue 10's models (spurious-background ViT, CNN classifier) have their own budget


@pytest.fixture(scope="module")
def manifest():
    return read_manifest(zoo_dir())


def test_every_zoo_model_is_shipped_within_the_size_budget(manifest):
    d = zoo_dir()
    missing = [e.name for e in ZOO if f"{e.name}.safetensors" not in manifest["files"]]
    assert not missing, f"not built: {missing} (run `vitscope zoo build NAME`)"
    extras = {f"{e.name}.safetensors" for e in ZOO if e.extra}
    total = sum((d / f).stat().st_size for f in manifest["files"] if f not in extras)
    assert total <= MAX_BYTES, f"shipped weights take {total / 1e6:.1f} MB (budget 25 MB)"
    extra_total = sum((d / f).stat().st_size for f in extras)
    assert extra_total <= EXTRA_MAX_BYTES, f"issue 10's models take {extra_total / 1e6:.1f} MB (budget 5 MB)"
    checkpoints = [f for f in manifest["files"] if "@step" in f]
    assert len(checkpoints) <= 4 and len({f.split("@")[0] for f in checkpoints}) <= 1


# Models whose current recipe does not reach the zoo's bar yet (issue 4 stays open while this is non-empty).
BELOW_BAR: dict[str, str] = {
    "tiny-vit-mae": "MAE's CLS reaches k-NN 0.524 after 4800 steps (untrained 0.198); bar: raw pixels (0.699) + 0.15",
}


#: the models whose held-out score `make test` measures again: none (about 10 s for the four quick ones, and the
#: golden demo already pins every shipped model's numbers); `make zoo-check` measures every model (the k-NN ones
#: score 3,000 images, about 6 s each)
MEASURED: set[str] = set()
EVERY_MODEL = os.environ.get("VITSCOPE_ZOO_CHECK") == "1"


def measured_here(name: str) -> bool:
    return EVERY_MODEL or name in MEASURED


@pytest.mark.parametrize("entry", ZOO, ids=lambda e: e.name)
def test_shipped_model_loads_fast_and_reproduces_its_score(entry, manifest):
    record = manifest["models"][entry.name]
    as_json = json.loads(json.dumps(entry.to_dict()))  # the manifest stores tuples as lists
    shipped = {k: v for k, v in record["entry"].items() if k != "description"}
    assert shipped == {k: v for k, v in as_json.items() if k != "description"}, "recipe changed: rebuild weights"
    start = time.perf_counter()
    vitscope.load_model(entry.name)
    assert time.perf_counter() - start < 1.0
    if measured_here(entry.name):
        assert _measured_score(entry.name) == pytest.approx(record["score"], abs=0.01)


@functools.cache
def _measured_score(name: str) -> float:
    """The held-out score of the shipped weights, measured once per test session (keyed by name alone)."""
    entry = get_entry(name)
    return heldout.score(entry, vitscope.load_model(name), heldout.entry_sets(entry))


@pytest.mark.parametrize("entry", [pytest.param(e, marks=pytest.mark.xfail(strict=True, reason=BELOW_BAR[e.name]))
                                   if e.name in BELOW_BAR else e for e in ZOO], ids=lambda e: e.name)
def test_shipped_model_clears_the_bar(entry, manifest):
    record = manifest["models"][entry.name]
    need = f"needs +{MARGIN_OVER_RANDOM} over the untrained twin and +{MARGIN_OVER_PIXELS} over raw pixels"
    assert meets_bar(record), f"recorded {record['score']:.3f} against {record['baselines']}; {need}"
    # and as measured here: a model on the bar must not slip below it within the reproduction tolerance
    if not measured_here(entry.name):
        return
    measured = _measured_score(entry.name)
    assert meets_bar({**record, "score": measured}), f"measured {measured:.3f} against {record['baselines']}; {need}"


@pytest.mark.parametrize("entry", [e for e in ZOO if e.snapshot_steps], ids=lambda e: e.name)
def test_training_checkpoints_load_and_improve(entry, manifest):
    record = manifest["models"][entry.name]
    scores = [record["baselines"]["random_init"]] + [record["snapshots"][str(s)] for s in entry.snapshot_steps]
    scores.append(record["score"])
    for s in (0, *entry.snapshot_steps):
        assert vitscope.load_model(f"{entry.name}@step{s}").spec.name == f"{entry.name}@step{s}"
    assert scores == sorted(scores), scores  # the score grows along training


def test_supervised_head_is_reachable_through_the_backbone():
    backbone = vitscope.load_model("tiny-vit-sup")
    pixels = torch.zeros(2, 3, 64, 64)
    tokens = backbone.final_norm(backbone.run_blocks(backbone.embed(pixels), 0, backbone.spec.num_blocks))
    assert torch.allclose(backbone.head(tokens), backbone(pixels), atol=1e-5)
    assert backbone.head(tokens).shape == (2, 10)


@pytest.mark.parametrize("entry", [e for e in ZOO if e.spurious is not None], ids=lambda e: e.name)
def test_spurious_variant_leans_on_the_background(entry, manifest):
    """Trained where backgrounds follow the class, it loses accuracy when they stop doing so (its recorded score on
    independent backgrounds measured again: `make zoo-check`; `make test` checks the lean itself in
    tests/validation/test_zoo_robustness.py)."""
    if not measured_here(entry.name):
        pytest.skip("the shipped score on independent backgrounds is measured by make zoo-check")
    record = manifest["models"][entry.name]
    clean = heldout.heldout_sets(entry.data_seed, entry.model.get("image_size", 64))  # independent backgrounds
    measured = heldout.score(entry, vitscope.load_model(entry.name), clean)
    assert measured == pytest.approx(record["score_independent_backgrounds"], abs=0.01)
    assert record["score"] - measured >= 0.05, (record["score"], measured)
