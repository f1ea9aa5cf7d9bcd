"""The SAE benchmark: tokens labelled by the majority of their pixels after the model's resize, units scored by AUROC
(both signs only where the sign is arbitrary), F1 at a threshold set on other tokens and the units a read-out needs,
and one small run of the command writing every number, the tables and the figure."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

import vitscope
from vitscope.data.synthetic.render import ObjectSpec
from vitscope.data.synthetic.world import SyntheticWorld
from vitscope.functional.concept_scores import auroc_table, best_f1_threshold, f1_at, ranked_units, units_needed
from vitscope.functional.concept_tokens import token_concept_fractions, token_concepts
from vitscope.sae.concepts import COLOURS, concept_labels, hue_bin, world_concepts


def test_a_token_holds_the_concepts_of_more_than_half_of_its_pixels() -> None:
    # a 4x4 image on a 2x2 grid: each token is a 2x2 cell; labels 0 (background), 1 and 2 (two parts of one object)
    labels = torch.tensor([[[0, 0, 1, 1],
                            [0, 1, 1, 1],
                            [2, 2, 0, 0],
                            [1, 0, 0, 0]]])
    membership = torch.tensor([[1, 0, 0], [0, 1, 1], [0, 1, 0]], dtype=torch.bool)  # background, object, part 1
    shares = token_concept_fractions(labels, membership, (2, 2))[0]
    torch.testing.assert_close(shares, torch.tensor([[0.75, 0.25, 0.25], [0.0, 1.0, 1.0], [0.25, 0.75, 0.25],
                                                     [1.0, 0.0, 0.0]], dtype=torch.float64))
    held = token_concepts(labels, membership, (2, 2))[0]
    assert held.tolist() == [[True, False, False], [False, True, True], [False, True, False], [True, False, False]]
    tie = torch.tensor([[[0, 1], [1, 0]]])  # two pixels of four: neither half holds the token
    assert token_concepts(tie, membership[:2, :2], (1, 1)).tolist() == [[[False, False]]]
    with pytest.raises(ValueError, match="multiples of the grid"):
        token_concepts(labels, membership, (3, 3))
    with pytest.raises(ValueError, match=r"pixel labels must lie in \[0, 3\)"):
        token_concepts(labels + 1, membership, (2, 2))


def test_hues_fall_in_six_bins_centred_on_their_colours() -> None:
    assert [COLOURS[hue_bin(c)] for c in ((255, 0, 0), (255, 255, 0), (0, 200, 0), (0, 255, 255), (0, 0, 90),
                                          (255, 0, 255), (255, 0, 40), (255, 140, 0), (255, 120, 0))] == \
        ["red", "yellow", "green", "cyan", "blue", "magenta", "red", "yellow", "red"]  # 351, 33 and 28 degrees


def test_every_concept_is_told_apart_within_its_context() -> None:
    contexts = {c.key: c.context for c in world_concepts(SyntheticWorld(size=32))}
    assert len(contexts) == 10 + 35 + 5 + 2 + 6  # classes, their parts, backgrounds, object or not, colours
    assert contexts["class/class03-house"] == contexts["colour/red"] == "object/object"
    assert contexts["part/class00-fish.tail"] == "class/class00-fish"
    assert contexts["background/dots"] == "object/background" and contexts["object/object"] is None
    assert all(c in contexts for c in contexts.values() if c is not None)


def _blocks(mask: np.ndarray, patch: int) -> np.ndarray:
    """``[H, W]`` bool -> ``[h*w]``: more than half of each patch's pixels (by hand, for the scene test)."""
    h, w = mask.shape[0] // patch, mask.shape[1] // patch
    return (mask.reshape(h, patch, w, patch).sum(axis=(1, 3)) * 2 > patch * patch).reshape(-1)


@pytest.mark.parametrize("size", [64, 128])  # the model's own size, and twice it (resized by the nearest filter)
def test_a_scenes_tokens_get_its_objects_classes_parts_colours_and_background(size: int) -> None:
    world = SyntheticWorld(size=size, seed=3)
    spec = vitscope.load_model("tiny-vit-sup").spec  # 64 px, patches of 8
    scene = world.render([ObjectSpec(2, world.instance_id(2, 5), {"tx": size * 0.4, "ty": size * 0.5,
                                                                    "scale": size * 0.4, "angle": 0.2}),
                          ObjectSpec(7, world.instance_id(7, 1), {"tx": size * 0.7, "ty": size * 0.6,
                                                                    "scale": size * 0.3, "angle": -0.3})],
                         background=3)
    concepts = world_concepts(world)
    key = {c.key: i for i, c in enumerate(concepts)}
    labels = concept_labels([scene], world, spec)[0]  # [64, C]
    assert labels.shape == (64, len(concepts))

    def by_hand(mask: np.ndarray) -> np.ndarray:
        step = size // 64  # the nearest filter keeps every step-th pixel, starting within the first cell
        return _blocks(mask[step // 2::step, step // 2::step], 8)

    car, flower = scene.objects
    objects = car.mask | flower.mask
    assert (labels[:, key["object/object"]] == by_hand(objects)).all()
    assert (labels[:, key["object/background"]] == by_hand(~objects)).all()
    assert (labels[:, key["background/gradient"]] == by_hand(~objects)).all()  # type 3
    assert not labels[:, [key[f"background/{b}"] for b in ("stripes", "checker", "blobs", "dots")]].any()
    assert (labels[:, key["class/class02-car"]] == by_hand(car.mask)).all()
    assert (labels[:, key["class/class07-flower"]] == by_hand(flower.mask)).all()
    assert (labels[:, key["part/class02-car.body"]] == by_hand(car.part_masks[1])).all()
    assert labels[:, key["class/class02-car"]].sum() > 8 and labels[:, key["part/class02-car.body"]].any()
    colours = {}
    for obj in scene.objects:
        for p, part in enumerate(obj.part_masks):
            name = COLOURS[hue_bin(world.appearance(obj.instance_id).colours[p, 0])]
            colours[name] = colours.get(name, np.zeros_like(part)) | part
    for name in COLOURS:
        assert (labels[:, key[f"colour/{name}"]] == by_hand(colours.get(name, np.zeros_like(objects)))).all(), name


def test_auroc_of_every_unit_is_scikit_learns_ties_included() -> None:
    rng = np.random.default_rng(0)
    units = rng.normal(size=(300, 5))
    units[:, 1] = np.maximum(units[:, 1], 0)  # mostly zeros, as an SAE latent
    units[:, 2] = np.round(units[:, 2])
    units[:, 3] = 0.0  # a dead unit
    labels = np.stack([rng.random(300) < 0.2, units[:, 0] > 0.5, np.zeros(300, bool)], axis=1)
    table = auroc_table(units, labels, chunk=2)
    for c in range(2):
        for j in range(5):
            assert table[c, j].item() == pytest.approx(roc_auc_score(labels[:, c], units[:, j]), abs=1e-12)
    assert table[1, 0] == 1.0 and table[1, 3] == 0.5 and torch.isnan(table[2]).all()


def test_a_unit_holding_nan_scores_nothing_and_ranks_last() -> None:
    """A sort ranks NaN above every number: [nan, nan, .1, .2, .3, .4] scored 0.889 (scikit-learn refuses it), an
    all-NaN unit 0.222, read negated 0.778, the best detector of its concept."""
    units = np.array([[np.nan, 0.0, np.nan], [np.nan, 0.1, np.nan], [0.1, 0.2, np.nan], [0.2, 0.9, np.nan],
                      [0.3, 0.8, np.nan], [0.4, 0.3, np.inf]])
    labels = np.array([[True], [True], [False], [False], [True], [False]])
    table = auroc_table(units, labels)
    assert torch.isnan(table[0, [0, 2]]).all() and table[0, 1].item() == pytest.approx(
        roc_auc_score(labels[:, 0], units[:, 1]))
    order, _ = ranked_units(table, both_signs=True)
    assert order[0].tolist()[0] == 1
    fit = labels[:, 0]
    assert units_needed(units, fit, units, fit, [0, 2]) == (None, pytest.approx(float("nan"), nan_ok=True))
    assert units_needed(units, fit, units, fit, [0, 1, 2], target=0.2)[0] == 1  # the NaN units passed over


def test_the_best_unit_is_read_with_either_sign_only_where_signs_are_arbitrary() -> None:
    rng = np.random.default_rng(1)
    concept = rng.random(2000) < 0.3
    units = np.stack([rng.normal(size=2000), -concept.astype(float) + 0.1 * rng.normal(size=2000), rng.normal(size=2000)
                      + concept], axis=1)
    table = auroc_table(units, concept[:, None])
    order, sign = ranked_units(table, both_signs=True)
    assert order[0, 0] == 1 and sign[0, 1] == -1  # the negated indicator, read negated
    order, sign = ranked_units(table, both_signs=False)
    assert order[0, 0] == 2 and sign[0, 1] == 1 and table[0, 1] < 0.01  # as it is, it is the worst unit


def test_an_indicator_needs_one_unit_and_random_units_reach_nothing() -> None:
    rng = np.random.default_rng(2)
    concept = rng.random(4000) < 0.2
    units = np.concatenate([rng.normal(size=(4000, 6)), concept[:, None] * 3.0 + rng.normal(size=(4000, 1)) * 0.1],
                           axis=1)
    fit, test = slice(0, 2000), slice(2000, None)
    table = auroc_table(units[fit], concept[fit, None])
    order, _ = ranked_units(table, both_signs=False)
    assert order[0, 0] == 6 and table[0, 6] == 1.0
    threshold, fit_f1 = best_f1_threshold(units[fit, 6], concept[fit])
    assert fit_f1 == 1.0 and f1_at(units[test, 6], concept[test], threshold) == 1.0
    assert units_needed(units[fit], concept[fit], units[test], concept[test], order[0].tolist()) == (1, 1.0)
    noise = units[:, :6]
    random_auc = auroc_table(noise[test], concept[test, None])
    assert (abs(random_auc - 0.5) < 0.05).all()
    needed, reached = units_needed(noise[fit], concept[fit], noise[test], concept[test], range(6), cap=6)
    assert needed is None and abs(reached - 0.5) < 0.05
    assert f1_at(noise[test, 0], concept[test], np.inf) == 0.0


def test_a_concept_two_units_share_needs_both() -> None:
    rng = np.random.default_rng(3)
    units = rng.normal(size=(6000, 4))
    concept = units[:, 0] + units[:, 1] > 1.0  # neither alone ranks it well; their sum does
    fit, test = slice(0, 3000), slice(3000, None)
    table = auroc_table(units[fit], concept[fit, None])
    order, sign = ranked_units(table, both_signs=True)
    assert set(order[0, :2].tolist()) == {0, 1} and table[0, :2].max() < 0.9
    needed, reached = units_needed(units[fit], concept[fit], units[test], concept[test], order[0].tolist(),
                                   sign=float(sign[0, order[0, 0]]))
    assert needed == 2 and reached > 0.95
    assert units_needed(units[fit], concept[fit], units[test], concept[test], order[0].tolist(), cap=1)[0] is None


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory):
    from helpers.cli import cli

    out = tmp_path_factory.mktemp("sae_benchmark")
    run = cli("sae", "benchmark", "--models", "tiny-vit-sup", "--hook", "blocks.4.resid_post", "--images", "24",
              "--heldout", "16", "--latents", "32", "--k", "4", "--tokens", "2048", "--batch-tokens", "256",
              "--fit-tokens", "1024", "--min-tokens", "5", "--cap", "4", "--out", str(out))
    return run, out


def test_the_command_writes_every_number_the_tables_and_the_figure(small_run) -> None:
    run, out = small_run
    assert run.returncode == 0, run.stdout + run.stderr
    assert "tiny-vit-sup neurons: 512 units" in run.stderr and "-> " in run.stdout
    doc = json.loads((out / "benchmark.json").read_text())
    found = doc["models"]["tiny-vit-sup"]
    assert doc["settings"]["neuron_hook"] == "blocks.4.mlp.post" and found["tokens"]["heldout"] == 16 * 64
    assert {m: found["methods"][m]["units"] for m in found["methods"]} == {
        "sae": 32, "pca": 32, "ica": 32, "kmeans": 32, "random": 32, "neurons": 512}
    assert [m for m in found["methods"] if found["methods"][m]["both_signs"]] == ["pca", "ica", "random"]
    records = found["methods"]["sae"]["concepts"]
    assert set(records) == {c["key"] for c in doc["concepts"]}
    scored = [k for k, r in records.items() if r is not None]
    assert {k.split("/")[0] for k in scored} == {"class", "part", "background", "object", "colour"}
    for key in scored:
        counts = found["positives"][key]
        assert counts["fit"] >= 5 and counts["heldout"] >= 5
        for method in found["methods"].values():
            r = method["concepts"][key]
            assert 0 <= r["auroc"] <= 1 and 0 <= r["f1"] <= 1 and r["needed"] in (None, 1, 2, 3, 4)
            assert (r["needed"] == 1) == (r["auroc"] >= 0.9)
            if key.startswith("object/"):
                assert r["auroc_within"] is None  # no context: the two halves of every image
            elif key.startswith(("class/", "background/")):  # told apart from plenty of sibling tokens
                assert 0 <= r["auroc_within"] <= 1
    reference = found["references"]["class/class02-car"]
    assert 0.5 < reference["context_auroc"] < 1 and 0 < reference["all_positive_f1"] < 0.5
    assert found["references"]["object/object"]["context_auroc"] is None
    object_ = max(found["methods"][m]["concepts"]["object/object"]["auroc"] for m in found["methods"])
    assert object_ > 0.8  # some unit of a trained ViT tells objects from background
    assert 0 <= found["sae"]["fvu"] < 1.5 and found["sae"]["l0"] == pytest.approx(4.0)
    table = (out / "benchmark.md").read_text()
    assert "| tiny-vit-sup | object (2) |" in table and "### tiny-vit-sup" in table
    assert (out / "auroc.png").stat().st_size > 0 and (out / "sae" / "tiny-vit-sup" / "cfg.json").is_file()


def test_the_numbers_are_written_after_the_figure_and_tables(small_run, tmp_path, monkeypatch) -> None:
    """A kill while the figure was drawn left a benchmark.json without its figure: the json is written last."""
    from vitscope.sae import benchmark_tables
    from vitscope.viz import concept_figures

    doc = json.loads((small_run[1] / "benchmark.json").read_text())

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(concept_figures, "concept_auroc_figure", killed)
    with pytest.raises(KeyboardInterrupt):
        benchmark_tables.write_benchmark(doc, tmp_path)
    assert not (tmp_path / "benchmark.json").exists()
    monkeypatch.undo()
    paths = benchmark_tables.write_benchmark(doc, tmp_path)
    assert paths[0] == tmp_path / "benchmark.json" and (tmp_path / "auroc.png").is_file()


def test_bad_input_is_one_line() -> None:
    from helpers.cli import cli

    bad = cli("sae", "benchmark", "--models", "tiny-vit-sup", "--hook", "blocks.9.resid_post", "--images", "2",
              "--heldout", "2")
    assert bad.returncode == 2 and "tiny-vit-sup has no hook 'blocks.9.resid_post'" in bad.stdout + bad.stderr
    bad = cli("sae", "benchmark", "--models", "tiny-vit-sup", "--hook", "norm")
    assert bad.returncode == 1 and "hook must be a block's hook" in bad.stdout + bad.stderr
    bad = cli("sae", "benchmark", "--models", "tiny-cnn-nope", "--images", "2", "--heldout", "2")
    assert bad.returncode == 1 and "tiny-cnn-nope" in bad.stdout + bad.stderr
