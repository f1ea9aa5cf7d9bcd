"""Zoo weights: fp16 files checked against the manifest, clear errors, names, and a whole tiny build."""

import json
import re

import pytest
import torch
from typer.testing import CliRunner

import vitscope
from vitscope.cli.main import app
from vitscope.models.errors import ModelLoadError
from vitscope.zoo import heldout
from vitscope.zoo.build import build
from vitscope.zoo.cards import meets_bar
from vitscope.zoo.catalog import ZOO, ZooEntry, get_entry
from vitscope.zoo.store import (
    build_model,
    load_zoo_model,
    read_manifest,
    save_weights,
    split_name,
    wrap_zoo_model,
    write_manifest,
)

TINY = ZooEntry("test-tiny-sup", "supervised", "tiny-vit",
                {"image_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2, "num_classes": 10},
                {"warmup": 1}, steps=4, batch_size=16, score="accuracy", data_seed=77, train_images=64,
                snapshot_steps=(2,))


def _ship(tmp_path, name="tiny-vit-sup"):
    model = build_model(get_entry(name))
    manifest = read_manifest(tmp_path)
    manifest["files"][f"{name}.safetensors"] = save_weights(model, tmp_path / f"{name}.safetensors", name)
    write_manifest(tmp_path, manifest)
    return model


def test_weights_roundtrip_through_fp16_and_record_attention(tmp_path):
    model = _ship(tmp_path)
    loaded = load_zoo_model("tiny-vit-sup", tmp_path)
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[key], value.half().float())
    assert loaded.model.state_dict()["cls_token"].dtype == torch.float32
    with loaded.record(["blocks.0.attn.pattern"]) as rec:
        loaded(torch.zeros(1, 3, 64, 64))
    assert rec["blocks.0.attn.pattern"].shape == (1, 4, 65, 65)


def test_load_model_finds_zoo_names_through_the_environment(tmp_path, monkeypatch):
    _ship(tmp_path)
    monkeypatch.setenv("VITSCOPE_ZOO_DIR", str(tmp_path))
    backbone = vitscope.load_model("tiny-vit-sup")
    assert backbone.spec.name == "tiny-vit-sup" and backbone.spec.has_head


def test_tampered_weights_are_refused(tmp_path):
    _ship(tmp_path)
    path = tmp_path / "tiny-vit-sup.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="checksum"):
        load_zoo_model("tiny-vit-sup", tmp_path)


@pytest.mark.parametrize("recorded", [True, False])
def test_an_entry_of_another_architecture_is_refused(tmp_path, recorded):
    """The checksum proved only the file's bytes: 8 heads for a 4-head file loaded silently (other logits), and
    another depth or no head stopped with a bare KeyError."""
    sup = get_entry("tiny-vit-sup")
    _ship(tmp_path)
    if recorded:  # what a build writes: the entry the file was built from
        manifest = read_manifest(tmp_path)
        manifest["models"]["tiny-vit-sup"] = {"entry": sup.to_dict()}
        write_manifest(tmp_path, manifest)
    cases = [({"depth": 4}, "depth 6 (built) != 4" if recorded else "unexpected blocks.4.attn.proj.bias"),
             ({"num_classes": 0}, "num_classes 10 (built) != 0" if recorded else "unexpected head.bias, head.weight"),
             ({"embed_dim": 64}, "embed_dim 128 (built) != 64" if recorded else "proj.bias (128,) (file) != (64,)")]
    if recorded:  # no tensor's shape depends on it: only the record tells
        cases.append(({"num_heads": 8}, "num_heads 4 (built) != 8"))

    def entry(**change):
        return ZooEntry(**{**sup.to_dict(), "model": {**sup.model, **change}})

    for change, why in cases:
        with pytest.raises(ModelLoadError, match=re.escape(why)):
            load_zoo_model("tiny-vit-sup", tmp_path, entry=entry(**change))
    same = entry(mlp_ratio=4.0, seed=5)  # a default written out, another initial seed: the same model once loaded
    assert load_zoo_model("tiny-vit-sup", tmp_path, entry=same).spec.num_heads == 4


@pytest.mark.parametrize("text, why", [("{bad", "not a readable zoo manifest"), ("[1, 2]", "not a zoo manifest")])
def test_a_damaged_manifest_is_one_error_naming_it(tmp_path, text, why):
    _ship(tmp_path)
    (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(ModelLoadError, match=why):
        load_zoo_model("tiny-vit-sup", tmp_path)


def test_unbuilt_and_unknown_names_say_what_to_do(tmp_path):
    with pytest.raises(ModelLoadError, match="vitscope zoo build tiny-vit-mae"):
        load_zoo_model("tiny-vit-mae", tmp_path)
    with pytest.raises(ModelLoadError, match="zoo models: tiny-vit-sup"):
        load_zoo_model("tiny-vit-nope", tmp_path)
    with pytest.raises(ModelLoadError, match="NAME@step"):
        split_name("tiny-vit-metric@stepX")
    assert split_name("tiny-vit-metric@step250") == ("tiny-vit-metric", 250)
    untrained = load_zoo_model("tiny-vit-metric@step0", tmp_path)  # no file needed: the seeded initial weights
    twin = build_model(get_entry("tiny-vit-metric"))
    assert all(torch.equal(a, b) for a, b in zip(untrained.model.state_dict().values(), twin.state_dict().values()))


def test_every_zoo_name_and_checkpoint_is_registered():
    from vitscope.models.registry import registry

    reg = registry()
    for entry in ZOO:
        assert reg[entry.name].zoo
        for step in entry.snapshot_steps:
            assert f"{entry.name}@step{step}" in reg
    assert "tiny-vit-metric@step0" in reg and "tiny-vit-sup@step0" not in reg
    assert reg["tiny-vit-metric-p16"].patch == 16


def test_a_whole_build_trains_scores_ships_and_loads(tmp_path, small_heldout):
    record = build(TINY, tmp_path, progress=False)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert set(manifest["files"]) == {"test-tiny-sup.safetensors", "test-tiny-sup@step2.safetensors"}
    assert manifest["models"]["test-tiny-sup"]["score"] == record["score"]
    assert 0.0 <= record["score"] <= 1.0 and set(record["baselines"]) == {"random_init", "raw_pixels"}
    assert record["params"] == sum(p.numel() for p in build_model(TINY).parameters())
    assert isinstance(meets_bar(record), bool)
    card = (tmp_path / "cards" / "test-tiny-sup.md").read_text()
    assert "randomly initialised twin" in card and f"{record['score']:.3f}" in card
    assert not (tmp_path / ".build" / "test-tiny-sup" / "train_state.pt").exists()
    loaded = load_zoo_model("test-tiny-sup@step2", tmp_path, entry=TINY)
    assert loaded.spec.name == "test-tiny-sup@step2"
    # the recorded score is what the shipped (fp16) file reproduces
    sets = heldout.HeldOut(*(heldout.synthetic_split(n, s, size=32) for n, s in ((40, 77), (30, 77 + 10_000))))
    final = load_zoo_model("test-tiny-sup", tmp_path, entry=TINY)
    assert heldout.score(TINY, final, sets) == pytest.approx(record["score"], abs=1e-9)
    assert heldout.score(TINY, wrap_zoo_model(build_model(TINY), "twin"), sets) == pytest.approx(
        record["baselines"]["random_init"], abs=1e-9)


@pytest.mark.parametrize("math", [False, True])
def test_build_trains_with_the_attention_kernel_of_the_entry(tmp_path, monkeypatch, small_heldout, math):
    import dataclasses

    from vitscope.zoo import build as build_module

    configs = []

    def spy(recipe, data, config, _fit=build_module.fit):
        configs.append(config)
        return _fit(recipe, data, config)

    monkeypatch.setattr(build_module, "fit", spy)
    entry = dataclasses.replace(TINY, math_attention=math, snapshot_steps=())
    record = build(entry, tmp_path, progress=False)
    assert [c.math_attention for c in configs] == [math]
    assert record["entry"]["math_attention"] is math
    card = (tmp_path / "cards" / "test-tiny-sup.md").read_text()
    assert ("explicit attention" in card) is math


def test_zoo_list_cli_reports_built_and_unbuilt(tmp_path):
    _ship(tmp_path)
    manifest = read_manifest(tmp_path)
    manifest["models"]["tiny-vit-sup"] = {"params": 123, "score": 0.9, "baselines": {"random_init": 0.1,
                                                                                      "raw_pixels": 0.5}}
    write_manifest(tmp_path, manifest)
    result = CliRunner().invoke(app, ["zoo", "list", "--json", "--dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.output)}
    assert rows["tiny-vit-sup"]["built"] and rows["tiny-vit-sup"]["score"] == 0.9
    assert not rows["tiny-vit-mae"]["built"] and rows["tiny-vit-mae"]["score"] is None
    table = CliRunner().invoke(app, ["zoo", "list", "--dir", str(tmp_path)])
    assert "not built" in table.output and "0.900" in table.output
    bad = CliRunner().invoke(app, ["zoo", "build", "tiny-vit-nope", "--dir", str(tmp_path)])
    assert bad.exit_code == 1 and "zoo models:" in bad.output


def test_zoo_build_core_leaves_out_the_extras(monkeypatch, tmp_path):
    import vitscope.zoo.build as zoo_build
    from vitscope.zoo.catalog import ZOO

    asked = []
    monkeypatch.setattr(zoo_build, "build_many", lambda names, *a, **k: asked.append(names) or [])
    assert CliRunner().invoke(app, ["zoo", "build", "--core", "--dir", str(tmp_path)]).exit_code == 0
    assert CliRunner().invoke(app, ["zoo", "build", "--dir", str(tmp_path)]).exit_code == 0
    core, everything = asked
    assert core == [e.name for e in ZOO if not e.extra] and "tiny-vit-sup-spurious" not in core
    assert everything == [e.name for e in ZOO] and set(everything) - set(core) == {"tiny-vit-sup-spurious",
                                                                                   "tiny-resnet-sup"}
    both = CliRunner().invoke(app, ["zoo", "build", "tiny-vit-sup", "--core", "--dir", str(tmp_path)])
    assert both.exit_code == 2


def test_parallel_builds_start_with_the_longest_recorded_training(tmp_path):
    from vitscope.zoo.build import longest_first
    from vitscope.zoo.store import write_manifest

    write_manifest(tmp_path, {"format": 1, "files": {}, "models": {
        "short": {"train_seconds": 10.0}, "long": {"train_seconds": 300.0}, "mid": {"train_seconds": 50.0}}})
    assert longest_first(["new", "short", "long", "other", "mid"], tmp_path) == ["long", "mid", "short", "new",
                                                                                 "other"]


@pytest.mark.parametrize(("score", "twin", "pixels", "meets"), [
    (0.849, 0.198, 0.699, True),  # exactly +0.15 (session 9's distill; this pair's float difference is just above)
    (0.848, 0.198, 0.699, False),
    (0.235, 0.0, 0.085, True),  # 0.235 - 0.085 < 0.15 in floating point: a tie must still count
    (0.205, 0.005, 0.0, True),  # the same for the twin's +0.20
    (0.204, 0.005, 0.0, False),
])
def test_the_bar_counts_exact_ties_as_met(score, twin, pixels, meets):
    assert meets_bar({"score": score, "baselines": {"random_init": twin, "raw_pixels": pixels}}) is meets
