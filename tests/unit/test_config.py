"""Options from a YAML file (--config) merged with command-line options."""

from __future__ import annotations

from pathlib import Path

import pytest

from vitscope.workflows.options import (
    ANALYZE_OPTIONS,
    COMPARE_OPTIONS,
    PROBE_OPTIONS,
    ConfigError,
    load_config,
    resolve_options,
)


def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


def test_command_line_overrides_file_which_overrides_defaults(tmp_path):
    cfg = _yaml(tmp_path, "model: tiny-vit\ndata: photos/\nout: runs/a\nbatch-size: 8\nlimit: 100\n"
                          "analyses: [attention, cka]\n")
    opts = resolve_options(ANALYZE_OPTIONS, {"limit": 5, "model": None}, cfg)
    assert opts["model"] == "tiny-vit" and opts["data"] == "photos/" and opts["out"] == Path("runs/a")
    assert opts["batch_size"] == 8  # from the file (dash spelling accepted)
    assert opts["limit"] == 5  # the command line wins
    assert opts["analyses"] == ["attention", "cka"]
    assert opts["strict"] is False and opts["resume"] is True and opts["checkpoint_seconds"] == 60.0  # defaults
    assert opts["config_file"] == str(cfg)


def test_lists_accept_comma_strings_from_either_source(tmp_path):
    cfg = _yaml(tmp_path, "models: tiny-vit-sup, tiny-vit-mae\ndata: d\nout: o\n")
    assert resolve_options(COMPARE_OPTIONS, {}, cfg)["models"] == ["tiny-vit-sup", "tiny-vit-mae"]
    assert resolve_options(COMPARE_OPTIONS, {"models": "a,b"}, cfg)["models"] == ["a", "b"]


def test_unknown_key_is_a_clear_error_with_the_closest_name(tmp_path):
    cfg = _yaml(tmp_path, "model: tiny-vit\nbatchsize: 8\n")
    with pytest.raises(ConfigError, match=r"unknown key 'batchsize'.*did you mean 'batch_size'"):
        load_config(cfg, ANALYZE_OPTIONS)
    # a compare-only key is unknown to analyze
    with pytest.raises(ConfigError, match="unknown key 'models'"):
        load_config(_yaml(tmp_path, "models: [a, b]\n"), ANALYZE_OPTIONS)


@pytest.mark.parametrize("text, needle", [
    ("batch_size: many\n", "must be an integer"),
    ("batch_size: 0\n", "at least 1"),
    ("strict: maybe\n", "true or false"),
    ("analyses: {a: 1}\n", "list of names"),
    ("- model\n", "must be a mapping"),
    ("model: [unclosed\n", "not valid YAML"),
])
def test_bad_values_name_the_key_and_the_file(tmp_path, text, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(_yaml(tmp_path, text), ANALYZE_OPTIONS)


def test_missing_required_option_says_where_to_give_it(tmp_path):
    with pytest.raises(ConfigError, match=r"missing --data: give it on the command line or as 'data:'"):
        resolve_options(ANALYZE_OPTIONS, {"model": "tiny-vit", "out": "o"})


def test_missing_config_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        resolve_options(ANALYZE_OPTIONS, {}, tmp_path / "nope.yaml")


def test_empty_file_gives_defaults(tmp_path):
    opts = resolve_options(ANALYZE_OPTIONS, {"model": "m", "data": "d", "out": "o"}, _yaml(tmp_path, ""))
    assert opts["batch_size"] == 16 and opts["analyses"] is None


def test_compare_takes_named_models_analyses_and_parameters_from_a_file(tmp_path):
    cfg = _yaml(tmp_path, "models: {sup: tiny-vit-sup, dino: 'hf:facebook/dinov2-small'}\ndata: d\nout: o\n"
                          "analyses: [attention_distance, attention_stats]\n"
                          "params: {attention_distance: {seed: 5}}\n")
    opts = resolve_options(COMPARE_OPTIONS, {"params": ["attention_distance.random_samples=2"]}, cfg)
    assert opts["models"] == {"sup": "tiny-vit-sup", "dino": "hf:facebook/dinov2-small"}
    assert opts["analyses"] == ["attention_distance", "attention_stats"]
    assert opts["params"] == {"attention_distance": {"seed": 5, "random_samples": "2"}}  # both sources, merged
    assert resolve_options(COMPARE_OPTIONS, {"models": "a=x,b=y"}, cfg)["models"] == ["a=x", "b=y"]
    with pytest.raises(ConfigError, match="must map display names to models"):
        load_config(_yaml(tmp_path, "models: {a: [x]}\n"), COMPARE_OPTIONS)


def test_probe_options_resolve_as_the_others_do(tmp_path):
    cfg = _yaml(tmp_path, "model: tiny-vit\ndata: d::imagefolder\nout: o\nblocks: [0, -1]\nlimit: 10\n"
                          "test-fraction: 0.3\nstrict: true\nresume: false\n")
    opts = resolve_options(PROBE_OPTIONS, {"seed": 2}, cfg)
    assert opts["blocks"] == (0, -1) and opts["limit"] == 10 and opts["test_fraction"] == 0.3
    assert opts["strict"] is True and opts["resume"] is False and opts["seed"] == 2
    assert opts["batch_size"] == 16 and opts["site"] == "resid_post" and opts["tiling"] == 0.0  # the defaults
    for given, blocks in (("0,3,-1", (0, 3, -1)), ("all", "all"), (-1, (-1,))):  # "all" overrides the file
        assert resolve_options(PROBE_OPTIONS, {"blocks": given}, cfg)["blocks"] == blocks
    with pytest.raises(ConfigError, match="comma-separated integers"):
        resolve_options(PROBE_OPTIONS, {"blocks": "0,x"}, cfg)
    with pytest.raises(ConfigError, match="at most 0.99"):
        load_config(_yaml(tmp_path, "test_fraction: 1.5\n"), PROBE_OPTIONS)


def test_the_record_types_parameters_alike_from_the_command_line_and_from_a_file(tmp_path):
    from vitscope.workflows.options import AnalyzeOptions, resolve

    cfg = _yaml(tmp_path, "model: tiny-vit\ndata: d\nout: o\n"
                          "params: {attention_distance: {seed: 5}, attention: {mass: 0.5}}\n")
    given = ["attention_distance.random_samples=2", "cka@cls.tokens=cls", "saliency_iou.mass=1e-1",
             "cls_attention_maps.images=0,2"]
    record = resolve(AnalyzeOptions, {"params": given}, cfg).record()
    assert record["params"] == {"attention_distance": {"seed": 5, "random_samples": 2},
                                "cls_attention_maps": {"images": [0, 2]},
                                "attention": {"mass": 0.5}, "cka@cls": {"tokens": "cls"},
                                "saliency_iou": {"mass": 0.1}}
    from_file = _yaml(tmp_path, "model: tiny-vit\ndata: d\nout: o\nparams: {attention_distance: {seed: '5'}}\n")
    assert resolve(AnalyzeOptions, {}, from_file).record()["params"] == {"attention_distance": {"seed": 5}}


def _given(o, tmp_path: Path):
    """A value of option ``o`` that is not its default, as a Python caller passes it."""
    values = {"bool": not o.default, "int": 3, "float": 7.5, "path": str(tmp_path / o.name),
              "list": ["attention_stats"], "params": {"attention_stats": {"seed": 1}},
              "models": ["tiny-vit", "tiny-vit-sup"], "str": f"{o.name}-given"}
    return values[o.kind]


@pytest.mark.parametrize("command", ["analyze", "compare_models"])
def test_python_keywords_are_the_commands_options(command, tmp_path, monkeypatch):
    """``vitscope.analyze`` and ``vitscope.compare_models`` take every option of their command (read from the
    options dataclass, so a new option cannot be left out) and hand each one to the run unchanged."""
    import inspect

    import vitscope
    from vitscope.workflows import analyze as analyze_module
    from vitscope.workflows import compare as compare_module
    from vitscope.workflows.options import AnalyzeOptions, CompareOptions, option_fields, option_table

    kind, module, runner = {"analyze": (AnalyzeOptions, analyze_module, "run_analyze"),
                            "compare_models": (CompareOptions, compare_module, "comparison_run")}[command]
    function = getattr(vitscope, command)
    keywords = set(inspect.signature(function).parameters)
    missing = [name for name in option_fields(kind) if name not in keywords]
    assert not missing, f"vitscope.{command} lacks the options {missing}"
    given = {name: _given(o, tmp_path) for name, o in zip(option_fields(kind), option_table(kind), strict=True)}
    seen = []

    def capture(options, *args, **kwargs):
        seen.append(options)
        raise KeyboardInterrupt  # stop before any pass

    monkeypatch.setattr(module, runner, capture)
    with pytest.raises(KeyboardInterrupt):
        function(**given)
    for name, value in given.items():
        got = getattr(seen[0], name)
        assert (str(got) if isinstance(got, Path) else got) == value, (name, got, value)
