"""Artifact diagnostics: the maths on hand-computed cases, and the analysis on planted ground truth (a tiny ViT whose
outliers, first block, sink head, massive dimensions and register neuron are known by construction) and its clean
twin."""

from __future__ import annotations

import math

import pytest
import torch

import vitscope
from vitscope.analyses.diagnostics.artifacts import Artifacts
from vitscope.data.synthetic.write import synthesize
from vitscope.functional.artifacts import NormBins, massive_activations, patch_variance, split_threshold
from vitscope.zoo.planted import PlantedArtifacts, plant_artifacts, planted_pair


def test_bins_put_a_hand_set_threshold_on_an_edge() -> None:
    bins = NormBins.through(150.0)
    edges = bins.edges()
    e = int(torch.argmin((edges - 150.0).abs()))
    assert math.isclose(float(edges[e]), 150.0, rel_tol=1e-12)
    b = bins.of(torch.tensor([149.99, 150.0, 150.01, 1e-9, 1e9]))
    assert b[0] == e - 1 and b[1] == e and b[2] == e and b[3] == 0 and b[4] == bins.count - 1


def _histogram(values: list[float], bins: NormBins = NormBins()) -> torch.Tensor:
    return torch.zeros(bins.count, dtype=torch.float64).index_add_(0, bins.of(torch.tensor(values)),
                                                                  torch.ones(len(values), dtype=torch.float64))


def test_the_split_finds_a_small_far_mode_and_nothing_in_one_mode() -> None:
    gen = torch.Generator().manual_seed(0)
    bulk = (10 * torch.exp(0.2 * torch.randn(970, generator=gen))).tolist()
    far = (300 * torch.exp(0.1 * torch.randn(30, generator=gen))).tolist()
    edge = split_threshold(_histogram(bulk + far))
    threshold = float(NormBins().edges()[edge])
    assert max(bulk) < threshold < min(far)
    assert split_threshold(_histogram(bulk)) is None  # one mode: split near its middle, half the tokens above
    assert split_threshold(_histogram(bulk + far), max_share=0.02) is None  # 3 % is more than 2 %
    near = (25 * torch.exp(0.1 * torch.randn(30, generator=gen))).tolist()  # 2.5x the bulk, under min_ratio 4
    assert split_threshold(_histogram(bulk + near)) is None
    assert split_threshold(torch.zeros(70)) is None


def test_massive_activations_need_both_thresholds() -> None:
    h = torch.ones(1, 4, 5)
    h[0, 2, 3] = -2000.0  # above 100 and 1000x the median (1)
    h[0, 1, 1] = 500.0  # above 100, not 1000x
    flagged, ratio, median = massive_activations(h)
    assert flagged.nonzero().tolist() == [[0, 2, 3]]
    assert float(median[0]) == 1.0 and float(ratio[0, 2, 3]) == 2000.0
    assert massive_activations(h, 100, 400)[0].sum() == 2  # 500 is 500x the median


def test_patch_variance_by_hand() -> None:
    pixels = torch.zeros(1, 1, 2, 4)
    pixels[0, 0, :, 2:] = torch.tensor([[0.0, 2.0], [0.0, 2.0]])  # second patch: values 0, 2, 0, 2
    assert patch_variance(pixels, 2).tolist() == [[0.0, 1.0]]


@pytest.fixture(scope="module")
def planted_runs(tmp_path_factory: pytest.TempPathFactory):
    root = synthesize(tmp_path_factory.mktemp("art") / "world", "coco", n=12, size=64, seed=5)
    planted, clean, truth = planted_pair()
    runs = {name: vitscope.run(b, f"{root}::coco", [Artifacts()], batch_size=5, progress=False, workers=0)["artifacts"]
            for name, b in (("planted", planted), ("clean", clean))}
    return runs, truth


def test_the_planted_outliers_are_found_where_and_from_where_they_were_planted(planted_runs) -> None:
    runs, truth = planted_runs
    r = runs["planted"]
    assert r.meta["first_block"] == truth.block
    rows = [f"block {b}" for b in range(truth.block, 6)]
    assert r.meta["rows_with_outliers"] == rows
    for row in range(truth.block + 1, 7):
        places = torch.nonzero(r["outlier_positions"][row].flatten() > 0).flatten().tolist()
        assert places == sorted(truth.positions)
        assert torch.all(r["outlier_positions"][row].flatten()[list(truth.positions)] == 1.0)  # in every image
        assert math.isclose(float(r["outlier_fraction"][row]), len(truth.positions) / 64)


def test_the_planted_sink_head_massive_dims_and_register_neuron(planted_runs) -> None:
    runs, truth = planted_runs
    r = runs["planted"]
    assert [(s["block"], s["head"]) for s in r.meta["sink_heads"]] == [(truth.sink_block, truth.sink_head)]
    assert r.meta["sink_heads"][0]["cls_share"] > 0.99 and r.meta["sink_criterion"] == "cls_share"
    others = r["sink_cls_outliers"].clone()
    others[truth.sink_block, truth.sink_head] = 0.0
    assert float(others.max()) < 0.3
    first = r.meta["register_neurons"][0]
    assert (first["block"], first["unit"]) == (truth.block, truth.unit)
    assert first["concentration"] > 1e3
    massive = r.meta["massive"]
    assert massive["blocks_with_massive"] == list(range(truth.block, 6))
    assert set(massive["largest_ratio_dims"][:2]) == set(truth.massive_dims)
    by_dim = r["massive_count_by_dim"][truth.block]
    assert set(torch.nonzero(by_dim).flatten().tolist()) == set(truth.massive_dims)
    assert float(r["massive_count_by_token"][truth.block, 0]) == 0.0  # the CLS token carries none


def test_the_clean_twin_flags_nothing(planted_runs) -> None:
    r = planted_runs[0]["clean"]
    assert r.meta["first_block"] is None and r.meta["rows_with_outliers"] == []
    assert r.meta["sink_heads"] == [] and r.meta["register_neurons"] == []
    assert r.meta["massive"]["blocks_with_massive"] == []
    assert r.meta["massive"]["largest_ratio"] < 100  # reported even when nothing passes
    assert float(r["outlier_fraction"].sum()) == 0.0


def test_a_hand_set_threshold_selects_the_same_tokens_and_is_reported_exactly(planted_runs, tmp_path) -> None:
    root = synthesize(tmp_path / "world", "coco", n=4, size=64, seed=5)
    planted, _, truth = planted_pair()
    r = vitscope.run(planted, f"{root}::coco", [Artifacts(threshold=300.0)], batch_size=4, progress=False,
                     workers=0)["artifacts"]
    assert all(t == pytest.approx(300.0, rel=1e-12) for t in r.meta["thresholds"])
    assert r.meta["first_block"] == truth.block


def test_attention_received_sums_to_one_per_query(planted_runs, tmp_path) -> None:
    """Every key bin and prefix token together receive all the attention: the sums per head add up to the images."""
    root = synthesize(tmp_path / "world", "coco", n=3, size=64, seed=2)
    backbone = vitscope.load_model("tiny-vit-sup")
    a = Artifacts()
    vitscope.run(backbone, f"{root}::coco", [a], batch_size=2, progress=False, workers=0)
    for source in ("all", "cls"):
        total = a.sums[f"sink_{source}"].sum(dim=-1) + a.sums[f"sink_{source}_prefix"].sum(dim=-1)
        torch.testing.assert_close(total, torch.full_like(total, 3.0))


def test_planting_refuses_what_it_cannot_edit() -> None:
    backbone = vitscope.load_model("tiny-vit-sup")
    with pytest.raises(ValueError, match="sink_block"):
        plant_artifacts(backbone.model, PlantedArtifacts(block=4, sink_block=3))
    with pytest.raises(ValueError, match="distinct"):
        plant_artifacts(backbone.model, PlantedArtifacts(tag_dim=125))
    with pytest.raises(ValueError, match="timm-layout"):
        plant_artifacts(torch.nn.Linear(2, 2))


@pytest.mark.parametrize(("where", "match"), [({"sink_head": 4}, "sink_head < 4"), ({"sink_head": -1}, "sink_head"),
                                              ({"unit": 512}, "unit < 512"), ({"unit": -1}, "unit"),
                                              ({"massive_dims": ()}, "at least one massive")])
def test_planting_refuses_a_head_unit_or_dimension_the_model_lacks_and_leaves_it_unedited(where, match) -> None:
    """tiny-vit-sup has 4 heads and 512 MLP units a block: a head or unit outside them (a negative one would be
    read from the end, and the truth would name a head the model does not have) or no massive dimension is
    refused before any weight changes."""
    backbone = vitscope.load_model("tiny-vit-sup")
    before = {k: v.clone() for k, v in backbone.model.state_dict().items()}
    with pytest.raises(ValueError, match=match):
        plant_artifacts(backbone.model, PlantedArtifacts(**where))
    after = backbone.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_test_time_register_takes_the_planted_outliers_and_the_sink(tmp_path) -> None:
    """Jiang et al. 2025 on ground truth: the register neuron's activation moved onto an extra token removes every
    patch outlier; the register gets the high norm and the sink head's CLS attention."""
    from vitscope.interventions.registers import test_time_register

    root = synthesize(tmp_path / "world", "coco", n=6, size=64, seed=4)
    planted, _, truth = planted_pair()
    registered, edits = test_time_register(planted, {truth.block: [truth.unit]})
    assert registered.spec.prefix_kinds == ("cls", "reg") and planted.spec.prefix_kinds == ("cls",)
    with registered.intervene(edits):
        r = vitscope.run(registered, f"{root}::coco", [Artifacts()], batch_size=3, progress=False,
                         workers=0)["artifacts"]
    assert r.meta["first_block"] is None and float(r["outlier_fraction"].sum()) == 0.0
    register_norm = r["prefix_norm"][:, 1]
    assert float(register_norm[truth.block]) < 20 < 1000 < float(register_norm[truth.block + 1:].min())
    assert float(r["sink_cls_prefix"][truth.sink_block, truth.sink_head, 1]) > 0.99
    assert r.meta["massive"]["blocks_with_massive"] == list(range(truth.block, 6))  # on the register now
    assert float(r["massive_count_by_token"][truth.block, 2]) == 0.0  # none on the patches
    without = vitscope.run(registered, f"{root}::coco", [Artifacts()], batch_size=3, progress=False,
                           workers=0)["artifacts"]  # the register alone, no edit: the outliers stay
    assert without.meta["first_block"] == truth.block


def test_the_page_on_artifacts_runs_as_written(tmp_path, monkeypatch, capsys) -> None:
    from helpers.doc_examples import DOC, python_blocks

    blocks = python_blocks(DOC.parent / "artifacts.md")
    assert len(blocks) == 1
    monkeypatch.chdir(tmp_path)
    synthesize(tmp_path / "world", "coco", n=6, size=64, seed=1)
    exec(compile(blocks[0], "docs/artifacts.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("tiny-vit-sup-planted 2 [{'block': 4, 'head': 1")
    assert lines[1] == "tiny-vit-sup-clean None [] []"
    assert lines[2].startswith("None tensor(")


def test_ablations_of_the_planted_outliers_stand_beside_their_controls(tmp_path) -> None:
    """Zeroing the outliers moves the output far more than putting their mean or another image's in their place
    (the planted outliers are the same in every image): the conclusion depends on the control, as published."""
    from vitscope.experiments.artifacts import artifact_ablations

    root = synthesize(tmp_path / "world", "coco", n=24, size=64, seed=6)
    planted, _, truth = planted_pair()
    found = vitscope.run(planted, f"{root}::coco", [Artifacts()], batch_size=12, progress=False,
                         workers=0)["artifacts"].meta
    rows = {(r["target"], r["control"]): r for r in artifact_ablations(planted, f"{root}::coco", found, images=12,
                                                                        reference_images=12, batch_size=12)}
    assert set(rows) == {("none", "none"), ("outliers", "zero"), ("outliers", "mean"), ("outliers", "resample"),
                         ("test_time_register", f"register neurons {truth.block}:[{truth.unit}]")}
    assert rows[("none", "none")]["output_kl"] == 0.0 and rows[("none", "none")]["knn_change"] == 0.0
    zero, mean = rows[("outliers", "zero")]["output_kl"], rows[("outliers", "mean")]["output_kl"]
    assert zero > 1e-3 > 1e3 * mean >= 0.0
    assert rows[("none", "none")]["outlier_fraction"] == 3 / 64 and rows[("none", "none")]["cls_to_outliers"] > 0.99
    assert rows[("outliers", "zero")]["outlier_fraction"] == 0.0  # gone from the block that makes them on
    ttr = rows[("test_time_register", f"register neurons {truth.block}:[{truth.unit}]")]
    assert ttr["outlier_fraction"] == 0.0 and ttr["cls_to_outliers"] == 0.0 and ttr["cls_to_registers"] > 0.99
    # the mean over all queries: the planted sink head sends every query's attention to the outliers
    assert rows[("none", "none")]["attention_to_outliers"] > 0.99 and ttr["attention_to_outliers"] == 0.0
    assert all(0.0 <= r["knn_accuracy"] <= 1.0 and 0.0 <= r["top1_kept"] <= 1.0 for r in rows.values())


def test_the_command_diagnoses_then_ablates_and_writes_a_report(tmp_path) -> None:
    import json

    from typer.testing import CliRunner

    from vitscope.cli.main import app

    root = synthesize(tmp_path / "world", "coco", n=10, size=64, seed=7)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["artifacts", "--model", "tiny-vit-planted", "--data", f"{root}::coco", "--out",
                                      str(out), "--images", "4", "-b", "10"])
    assert result.exit_code == 0, result.output
    assert "outliers from 2; sink heads 1 (by cls_share)" in result.output
    doc = json.loads((out / "results.json").read_text())
    assert doc["analyses"]["artifacts"]["summary"]["first_block"] == 2
    targets = [(r["target"], r["control"]) for r in doc["analyses"]["artifact_ablations"]["summary"]["rows"]]
    assert targets[:4] == [("none", "none"), ("outliers", "zero"), ("outliers", "mean"), ("outliers", "resample")]
    report = (out / "report.html").read_text()
    assert "Vision Transformers Need Registers" in report and "Artifact ablations" in report
    bad = CliRunner().invoke(app, ["artifacts", "--model", "tiny-vit-planted", "--data", f"{root}::coco", "--out",
                                   str(tmp_path / "o2"), "--param", "knn_probe.k=3"])
    assert bad.exit_code == 2 and "artifacts.KEY=VALUE" in bad.output


def test_compare_draws_the_outliers_of_each_model_per_block(planted_runs) -> None:
    """``compare --analyses artifacts``: each model's share of outliers after every block on one axis (with and
    without registers, here with and without the planted artifacts)."""
    from vitscope.comparison.curves import ModelRun, compare_runs

    runs, _ = planted_runs
    spec = vitscope.load_model("tiny-vit-sup").spec
    comparison = compare_runs([ModelRun(name, spec, {"artifacts": runs[name]}) for name in ("planted", "clean")])
    curves = comparison.curves["outlier_fraction"]
    assert curves["clean"].values == [0.0] * 6 and curves["clean"].blocks == list(range(6))
    assert curves["planted"].values == [0.0, 0.0] + [3 / 64] * 4


@pytest.mark.parametrize("kind", ["dinov2-reg", "dinov3", "siglip"])
def test_the_analysis_reads_models_with_registers_and_without_a_cls_token(kind: str, tmp_path) -> None:
    """Registers are prefix tokens with their own norms and attention received; without a CLS token the CLS
    quantities are NaN and the rest stands."""
    from helpers.hf_factories import make

    backbone = vitscope.wrap(make(kind), name=kind)
    root = synthesize(tmp_path / "world", "coco", n=4, size=64, seed=9)
    r = vitscope.run(backbone, f"{root}::coco", [Artifacts()], batch_size=2, progress=False, workers=0)["artifacts"]
    p, layers, heads = backbone.spec.num_prefix_tokens, backbone.spec.num_blocks, backbone.spec.num_heads
    assert r["prefix_norm"].shape == (layers + 1, p) and r["sink_all_prefix"].shape == (layers, heads, p)
    assert r.meta["prefix_kinds"] == list(backbone.spec.prefix_kinds)
    has_cls = backbone.spec.prefix_kinds[:1] == ("cls",)
    assert bool(torch.isnan(r["sink_cls_prefix"]).all()) != has_cls
    received = r["sink_all_prefix"].sum(dim=-1)  # the mean attention the prefix gets, and the patches the rest
    assert bool(((received >= 0) & (received <= 1 + 1e-6)).all())


def test_without_a_cls_token_sink_heads_are_listed_by_the_attention_of_every_query(tmp_path) -> None:
    """SigLIP has no prefix token: with a threshold below every norm, every patch is an outlier, so every query
    gives all of its attention to the outliers. Every head is a sink by Gu et al.'s mean over the queries, and the
    CLS share, which no query measures, stays NaN: in the result and in every row of the ablations (null, with its
    reason, in the written summary), edited rows included."""
    import json

    import pandas as pd

    from helpers.hf_factories import make
    from vitscope.experiments.artifacts import artifact_ablations
    from vitscope.strict_json import dumps
    from vitscope.workflows.artifacts import _note_nulls

    backbone = vitscope.wrap(make("siglip"), name="siglip")
    root = synthesize(tmp_path / "world", "coco", n=4, size=64, seed=9)
    r = vitscope.run(backbone, f"{root}::coco", [Artifacts(threshold=0.02)], batch_size=4, progress=False,
                     workers=0)["artifacts"]
    layers, heads = backbone.spec.num_blocks, backbone.spec.num_heads
    assert r.meta["sink_criterion"] == "all_share" and bool(torch.isnan(r["sink_cls_outliers"]).all())
    listed = {(s["block"], s["head"]): s["all_share"] for s in r.meta["sink_heads"]}
    assert set(listed) == {(b, h) for b in range(layers) for h in range(heads)}
    assert all(v == pytest.approx(1.0, abs=1e-6) for v in listed.values())
    rows = artifact_ablations(backbone, f"{root}::coco", r.meta, controls=("zero",), images=2, reference_images=2,
                              batch_size=4)
    assert [x["target"] for x in rows] == ["none", "outliers", "test_time_register"]
    assert all(math.isnan(x["cls_to_outliers"]) for x in rows)
    # the sink column a model without CLS has: every token is an outlier at this threshold, so it receives it all
    assert rows[0]["attention_to_outliers"] == pytest.approx(1.0, abs=1e-6)
    assert rows[1]["attention_to_outliers"] == 0.0  # zeroed: none is above the threshold any more
    table = pd.DataFrame(rows)
    summary = {"rows": json.loads(table.to_json(orient="records"))}
    _note_nulls(summary, table, backbone.spec)
    written = json.loads(dumps(summary))
    assert [x["cls_to_outliers"] for x in written["rows"]] == [None] * 3
    assert "rows.attention_to_outliers" not in written["null_reasons"]
    assert written["null_reasons"]["rows.cls_to_outliers"] == "the model has no CLS token"


def test_every_compared_quantity_has_its_section_text_and_caption() -> None:
    from vitscope.comparison.curves import QUANTITIES
    from vitscope.comparison.outputs import _INTRO
    from vitscope.comparison.result import CAPTIONS

    assert set(QUANTITIES) <= set(_INTRO) and set(QUANTITIES) <= set(CAPTIONS)


def test_hugging_face_models_get_the_test_time_register_row_and_a_refusal_is_reported(tmp_path) -> None:
    """The register goes into a Hugging Face ViT through a hook on its embeddings, so the ablations run it there too;
    BEiT (a relative position bias sized for its tokens) and DINOv2's classifier (it averages the patch tokens, the
    register with them) cannot take it, and say why instead of a row."""
    from helpers.hf_factories import make
    from vitscope import wrap
    from vitscope.experiments.artifacts import artifact_ablations

    root = synthesize(tmp_path / "world", "coco", n=8, size=64, seed=3)
    refusals = {"beit": "relative position bias", "dinov2": "classifier pools the patch tokens"}
    for kind in ("dinov2-reg", "beit", "dinov2"):
        backbone = wrap(make(kind), name=kind)
        found = {"first_block": None, "register_neurons": []}  # no outliers: the register alone beside the model
        not_run: dict[str, str] = {}
        rows = artifact_ablations(backbone, f"{root}::coco", found, controls=("zero",), images=4, reference_images=4,
                                  batch_size=8, neurons={0: [0]}, not_run=not_run)
        targets = [r["target"] for r in rows]
        if kind not in refusals:
            assert targets[-1] == "test_time_register" and not_run == {
                "outlier_ablations": "no outlier tokens were found, so there are none to ablate"}
            assert rows[-1]["control"] == "register neurons 0:[0]" and 0.0 <= rows[-1]["knn_accuracy"] <= 1.0
        else:
            assert "test_time_register" not in targets
            assert refusals[kind] in not_run["test_time_register"]


def test_outlier_controls_put_the_reference_in_place_of_the_outliers_only() -> None:
    """mean: each position's reference mean; resample inside a pass: image i takes reference image (i + 1) mod R;
    only the tokens above the threshold change, never the prefix."""
    from vitscope.hooks.edits import running_images
    from vitscope.interventions import ablate_outliers

    t = torch.ones(2, 5, 3)
    t[0, 2], t[1, 4], t[0, 0] = 10.0, 10.0, 10.0  # two outliers and a high-norm CLS (prefix: kept)
    mean = torch.arange(15.0).view(5, 3)
    (edit,) = ablate_outliers("blocks.0.resid_post", 5.0, 1, "mean", reference={"blocks.0.resid_post": mean}).values()
    out = edit(t, "blocks.0.resid_post")
    assert torch.equal(out[0, 2], mean[2]) and torch.equal(out[1, 4], mean[4])
    assert torch.equal(out[0, 0], t[0, 0]) and torch.equal(out[:, 1], t[:, 1])
    images = torch.arange(4 * 5 * 3, dtype=torch.float32).view(4, 5, 3) / 100
    (edit,) = ablate_outliers("h", 5.0, 1, "resample", reference={"h": images}).values()
    with running_images([7, 2]):  # dataset images 7 and 2: reference images 0 and 3
        out = edit(t, "h")
    assert torch.equal(out[0, 2], images[0, 2]) and torch.equal(out[1, 4], images[3, 4])


def test_resampled_controls_do_not_depend_on_the_batch_and_take_a_batch_of_one(tmp_path) -> None:
    """Resampling rolled each batch: its rows moved with -b, and a batch of one image stopped the command."""
    from vitscope.experiments.artifacts import artifact_ablations

    root = synthesize(tmp_path / "world", "coco", n=7, size=64, seed=6)
    planted, _, _ = planted_pair()
    found = vitscope.run(planted, f"{root}::coco", [Artifacts()], batch_size=7, progress=False,
                         workers=0)["artifacts"].meta
    rows = [{r["target"]: r for r in artifact_ablations(planted, f"{root}::coco", found, controls=("resample",),
                                                        images=3, reference_images=4, batch_size=b)
             if r["control"] == "resample"} for b in (1, 3, 7)]
    assert rows[0] and rows[0] == rows[1] == rows[2]


def test_outliers_of_the_embedding_are_ablated_at_the_first_blocks_input() -> None:
    """A first row with outliers that is the embedding's (a hand-set threshold below every norm) left out the
    outlier ablations without a word, and measured the rest at the automatic threshold."""
    from vitscope.experiments.artifacts import _outlier_site

    assert _outlier_site({"first_block": "embedding", "thresholds": [8.0, 8.0, 8.0], "blocks": [0, 1]}) == (
        "blocks.0.resid_pre", 8.0)
    assert _outlier_site({"first_block": 1, "thresholds": [None, None, 30.0], "blocks": [0, 1]}) == (
        "blocks.1.resid_post", 30.0)
    assert _outlier_site({"first_block": None, "thresholds": [None, None], "blocks": [0]}) == (None, None)


@pytest.mark.parametrize("spread", [0.25, 0.3])
def test_a_small_high_norm_mode_above_a_broad_bulk_is_found(spread: float) -> None:
    """Otsu splits a broad bulk near its middle before the 2 % mode above it (half the tokens above: not outliers);
    the split is searched again within that upper class. The same bulk alone, or a far broader one, still has no
    outliers (its last split's classes are too close)."""
    gen = torch.Generator().manual_seed(1)
    bins = NormBins()
    bulk = 50 * torch.exp(spread * torch.randn(9800, generator=gen))
    outliers = 300 * torch.exp(0.1 * torch.randn(200, generator=gen))

    def histogram(norms: torch.Tensor) -> torch.Tensor:
        return torch.zeros(bins.count, dtype=torch.float64).index_add_(0, bins.of(norms),
                                                                       torch.ones(len(norms), dtype=torch.float64))

    edge = split_threshold(histogram(torch.cat([bulk, outliers])))
    assert edge is not None
    threshold = float(bins.edges()[edge])
    above = torch.cat([bulk, outliers]) >= threshold
    assert above[-200:].all() and int(above[:-200].sum()) <= 0.01 * len(bulk)  # the mode, and few of the bulk
    assert split_threshold(histogram(bulk)) is None
    assert split_threshold(histogram(50 * torch.exp(1.5 * torch.randn(20000, generator=gen)))) is None


def test_without_a_register_neuron_the_test_time_register_says_why_it_is_absent(tmp_path) -> None:
    """tiny-vit-reg shows no outliers, so no register neuron is ranked: the command announces the test-time register
    with the ablations, writes no row for it, and says why in skipped_analyses and its summary, as for the outlier
    ablations it cannot run."""
    import json

    from typer.testing import CliRunner

    from vitscope.cli.main import app

    root = synthesize(tmp_path / "world", "coco", n=8, size=64, seed=7)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["artifacts", "--model", "tiny-vit-reg", "--data", f"{root}::coco", "--out",
                                      str(out), "--images", "4", "-b", "8"])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "results.json").read_text())
    summary = doc["analyses"]["artifacts"]["summary"]
    assert summary["first_block"] is None and not summary.get("register_neurons")
    targets = {r["target"] for r in doc["analyses"]["artifact_ablations"]["summary"]["rows"]}
    assert targets == {"none", "registers"}
    reason = "no outlier tokens were found, so there is no register neuron to move into a test-time register"
    none = "no outlier tokens were found, so there are none to ablate"
    assert {s["analysis"]: s["reason"] for s in doc["skipped_analyses"]} == {"test_time_register": reason,
                                                                            "outlier_ablations": none}
    assert f"test_time_register skipped: {reason}" in result.stdout.splitlines()
    assert f"outlier_ablations skipped: {none}" in result.stdout.splitlines()


def test_the_diagnosis_is_written_when_the_data_is_too_small_for_the_ablations_knn(tmp_path):
    from vitscope.workflows.artifacts import run_artifacts

    root = synthesize(tmp_path / "coco", "coco", n=4, size=32, seed=3)
    doc = run_artifacts("tiny-vit-planted", f"{root}::coco", tmp_path / "out", limit=1, images=1)
    assert doc["num_images"] == 1 and "artifacts" in doc["analyses"]
    reasons = {s["analysis"]: s["reason"] for s in doc["skipped_analyses"]}
    assert "need at least two classes" in reasons["artifact_ablations"], reasons
    assert (tmp_path / "out" / "report.html").exists()


def test_the_registered_planted_models_are_named_as_loaded() -> None:
    """``--model tiny-vit-planted`` printed and recorded the model as tiny-vit-sup-planted beside its id."""
    assert [vitscope.load_model(n).spec.name for n in ("tiny-vit-planted", "tiny-vit-planted-clean")] == [
        "tiny-vit-planted", "tiny-vit-planted-clean"]
