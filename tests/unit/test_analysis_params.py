"""Choosing analyses by name: groups, instance labels, and parameters from --param text or YAML values."""

from __future__ import annotations

import pytest

from vitscope.analyses import ANALYSES, GROUPS, register_analysis
from vitscope.analyses.params import ParameterError, build_analyses, convert, parse_param_assignments
from vitscope.models.spec import ModelSpec
from vitscope.workflows.options import ANALYZE_OPTIONS, ConfigError, resolve_options

VIT = ModelSpec(name="hand-vit", family="tiny-vit", kind="transformer", num_blocks=2, num_heads=2, embed_dim=8,
                mlp_dim=16, patch_size=4, grid=(2, 2), num_prefix_tokens=1, prefix_kinds=("cls",), image_size=(8, 8),
                has_head=True)
CNN = ModelSpec(name="hand-cnn", family="resnet", kind="cnn", num_blocks=2, num_heads=0, embed_dim=8, mlp_dim=0,
                patch_size=4, grid=(2, 2), num_prefix_tokens=0, prefix_kinds=(), image_size=(8, 8))


def build(selection, params=(), spec=VIT, targets=("label", "masks")):
    return build_analyses(selection, spec, targets, parse_param_assignments(list(params)))


def test_assignments_parse_and_bad_ones_say_how_to_write_them() -> None:
    assert parse_param_assignments(["knn_probe.k=20", "cka@cls.tokens=cls", "knn_probe.seed=1"]) == {
        "knn_probe": {"k": "20", "seed": "1"}, "cka@cls": {"tokens": "cls"}}
    for bad in ("knn_probe.k", "k=3", ".k=3"):
        with pytest.raises(ParameterError, match="ANALYSIS.PARAMETER=VALUE"):
            parse_param_assignments([bad])


def test_values_follow_the_constructor_annotations() -> None:
    knn, clustering, maps = ANALYSES["knn_probe"], ANALYSES["clustering"], ANALYSES["cls_attention_maps"]
    assert convert(knn, "k", "20") == 20 and convert(knn, "temperature", "1") == 1.0
    assert convert(clustering, "k", "none") is None and convert(clustering, "k", 4) == 4
    assert convert(maps, "images", "0,2") == (0, 2) and convert(maps, "images", "3") == (3,)
    assert convert(maps, "images", [1, 2]) == (1, 2)  # a YAML list
    assert convert(ANALYSES["cka"], "tokens", "cls") == "cls"
    assert convert(ANALYSES["cka"], "gram_minmax", "true") is True
    with pytest.raises(ParameterError, match="cka.batch must be an integer, got 'abc'"):
        convert(ANALYSES["cka"], "batch", "abc")
    with pytest.raises(ParameterError, match="must be an integer"):
        convert(knn, "k", "2.5")
    # scientific notation, on the command line and in a YAML file (YAML 1.1 reads 1e-3 as a string)
    assert convert(ANALYSES["artifacts"], "massive_relative", "1e3") == 1000.0
    assert convert(ANALYSES["linear_probe"], "lr", "1e-3") == 0.001 and convert(knn, "k", "1e1") == 10
    assert convert(ANALYSES["saliency_iou"], "mass", "5e-1") == 0.5
    with pytest.raises(ParameterError, match="must be a number"):
        convert(ANALYSES["linear_probe"], "lr", "fast")


def test_a_path_option_expands_the_home_folder(tmp_path, monkeypatch) -> None:
    from vitscope.outputs.folder import prepare_output

    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = tmp_path / "a.yaml"
    cfg.write_text("model: m\ndata: d\nout: ~/from-yaml\n")
    assert resolve_options(ANALYZE_OPTIONS, {}, cfg)["out"] == tmp_path / "from-yaml"
    assert prepare_output("~/made") == tmp_path / "made" and (tmp_path / "made").is_dir()


@pytest.mark.parametrize(("params", "message"), [
    (["knn_probe.k=0"], r"--param knn_probe.k=0: k must be a positive integer"),
    # checked when the probes are configured: after the pass they would cost the whole run
    (["linear_probe.epochs=0"], r"--param linear_probe.epochs=0: epochs must be a positive integer"),
    (["linear_probe.batch_size=0"], r"--param linear_probe.batch_size=0: batch_size must be a positive integer"),
    (["linear_probe.lr=-1"], r"--param linear_probe.lr=-1: lr must be a positive learning rate"),
    (["linear_probe.lr=0"], r"lr must be a positive learning rate"),
    (["knn_probe.random_kind=foo"], r"--param knn_probe.random_kind=foo: random_kind must be 'uniform' or 'gaussian'"),
    (["clustering.random_kind=foo"], r"random_kind must be 'uniform' or 'gaussian', or none"),
    (["linear_probe.random_kind=foo"], r"random_kind must be 'uniform' or 'gaussian', or none"),
    (["knn_probe.kk=3"], r"--param knn_probe.kk: knn_probe has no parameter 'kk'; its parameters: site, tokens, k"),
    (["cka.k=3"], r"cka is not among the analyses run"),
    (["probes.nothing=1"], r"no analysis of the 'probes' group has a parameter 'nothing'"),
    (["knnprobe.k=3"], r"Did you mean 'knn_probe'"),
])
def test_a_wrong_parameter_is_one_line_naming_it(params, message) -> None:
    with pytest.raises(ValueError, match=message) as info:
        build(["probes"], params)
    assert "\n" not in str(info.value)


def test_group_parameters_reach_every_member_that_takes_them_and_names_override() -> None:
    chosen = build(["attention"], ["attention.seed=3", "attention_rollout.seed=5", "cls_attention_maps.images=0,2"])
    seeds = {a.name: a.params["seed"] for a in chosen}
    assert seeds["attention_rollout"] == 5 and set(seeds.values()) == {3, 5}
    assert next(a for a in chosen if a.name == "cls_attention_maps").params["images"] == (0, 2)
    assert {a.name for a in chosen} == set(GROUPS["attention"])  # masks given: saliency runs too


def test_instance_labels_let_two_configurations_run_side_by_side() -> None:
    chosen = build(["cka", "cka@cls", "representation@cls"], ["cka@cls.tokens=cls", "representation@cls.batch=8"])
    by_name = {a.name: a for a in chosen}
    assert list(by_name) == ["cka", "cka@cls", "residual_cka@cls", "clustering@cls"]
    assert by_name["cka"].params["tokens"] == "all" and by_name["cka@cls"].params["tokens"] == "cls"
    assert by_name["cka@cls"].params["batch"] == 8 and by_name["residual_cka@cls"].params["batch"] == 8
    assert type(by_name["cka@cls"]).name == "cka"  # the registered name stays on the class
    with pytest.raises(ParameterError, match="NAME@TAG"):
        build(["cka@c-l-s"])


def test_groups_keep_what_can_run_and_explicit_names_must_run() -> None:
    assert [a.name for a in build(["representation"], spec=CNN)] == ["cka"]  # residual CKA and clustering: no
    with pytest.raises(ValueError, match="cannot run on hand-cnn"):
        build(["residual_cka"], spec=CNN)
    with pytest.raises(ValueError, match="no analysis of the 'masking' group can run"):
        build(["masking"], targets=())


def test_yaml_params_merge_with_the_command_line(tmp_path) -> None:
    cfg = tmp_path / "a.yaml"
    cfg.write_text("model: m\ndata: d\nout: o\nparams:\n  knn_probe: {k: 5, seed: 2}\n  cka: {tokens: cls}\n")
    opts = resolve_options(ANALYZE_OPTIONS, {"params": ["knn_probe.k=7"]}, cfg)
    assert opts["params"] == {"knn_probe": {"k": "7", "seed": 2}, "cka": {"tokens": "cls"}}
    chosen = build_analyses(["knn_probe", "cka"], VIT, ("label",), opts["params"])
    assert chosen[0].params["k"] == 7 and chosen[0].params["seed"] == 2 and chosen[1].params["tokens"] == "cls"
    cfg.write_text("model: m\ndata: d\nout: o\nparams: [k]\n")
    with pytest.raises(ConfigError, match="must map analyses to their parameters"):
        resolve_options(ANALYZE_OPTIONS, {}, cfg)


def test_registration_refuses_a_taken_name_and_bad_names() -> None:
    from vitscope.analyses.activations.mean import MeanActivation

    with pytest.raises(ValueError, match="already registered"):
        register_analysis("cka")(type("OtherCKA", (MeanActivation,), {}))
    with pytest.raises(ValueError, match="lower case"):
        register_analysis("Bad-Name")
    with pytest.raises(ValueError, match="order of analysis 'late_one' must be an integer"):
        register_analysis("late_one", order="late")
    with pytest.raises(ValueError, match="already the name of a group"):
        register_analysis("probes")(type("Probes", (MeanActivation,), {}))
    with pytest.raises(ValueError, match="Analysis subclasses"):
        register_analysis("not_an_analysis")(dict)
