"""docs/errors.md, configs and options: config files, ``--param`` and option values a user gets wrong."""

from __future__ import annotations

import json

import pytest

from helpers.bad_input import analyze, cli, folder_with_one_good_image, one_error


@pytest.fixture
def photos(tmp_path):
    return folder_with_one_good_image(tmp_path)


def _with_config(photos, tmp_path, text):
    config = tmp_path / "run.yaml"
    config.write_text(text)
    return analyze(photos, tmp_path / "out", "-c", str(config))


def test_config_unknown_key(photos, tmp_path):
    one_error(_with_config(photos, tmp_path, "batchsize: 4\n"), "unknown key 'batchsize' in config file", status=2)
    assert "did you mean 'batch_size'?" in _with_config(photos, tmp_path, "batchsize: 4\n").stderr


def test_config_wrong_type(photos, tmp_path):
    one_error(_with_config(photos, tmp_path, "batch_size: many\n"), "'batch_size' in", status=2)


def test_config_not_yaml(photos, tmp_path):
    one_error(_with_config(photos, tmp_path, "batch_size: [4\n"), "is not valid YAML (line 2)", status=2)
    one_error(_with_config(photos, tmp_path, "- a\n- b\n"), "must be a mapping of option: value", status=2)


@pytest.mark.parametrize(("text", "needle"), [("batch_size: .inf\n", "'batch_size' in"),
                                              ("limit: .nan\n", "'limit' in"),
                                              ("checkpoint_seconds: .nan\n", "'checkpoint_seconds' in")])
def test_config_wrong_type_not_a_finite_number(photos, tmp_path, text, needle):
    """.inf and .nan for an integer printed a traceback (int(inf)); NaN passed every range check."""
    one_error(_with_config(photos, tmp_path, text), needle, status=2)


@pytest.mark.parametrize("text", ["batch_size: 4\nbatch_size: 8\n", "batch_size: 4\nbatch-size: 8\n"])
def test_config_not_yaml_a_key_given_twice(photos, tmp_path, text):
    """The last of two values was taken without a word."""
    one_error(_with_config(photos, tmp_path, text), "twice", status=2)


def test_config_not_yaml_not_text(photos, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_bytes(b"\xff\xfe\x00binary\x00\x81")
    one_error(analyze(photos, tmp_path / "out", "-c", str(config)), "is not YAML: it is not UTF-8 text", status=2)


def test_param_wrong_type_infinite(photos, tmp_path):
    one_error(analyze(photos, tmp_path / "out", "-p", "attention_distance.random_samples=inf",
                      analyses="attention_distance"), "random_samples must be an integer", status=2)


@pytest.mark.parametrize("command", [("attribute", "{missing}", "-m", "tiny-vit-sup", "--method", "foo"),
                                     ("explain-pair", "-m", "tiny-vit-metric", "{missing}", "{missing}",
                                      "--projection", "foo")])
def test_option_not_a_choice_before_the_files(tmp_path, command):
    """A bad choice with a missing image said the image was missing (exit 1), not the choice (exit 2)."""
    args = [c.format(missing=tmp_path / "nope.png") for c in command]
    one_error(cli(*args, "-o", str(tmp_path / "out")), "must be one of", status=2)


def test_config_file_missing(photos, tmp_path):
    result = analyze(photos, tmp_path / "out", "-c", str(tmp_path / "absent.yaml"))
    one_error(result, "absent.yaml", status=2)


def test_param_unknown(photos, tmp_path):
    one_error(analyze(photos, tmp_path / "out", "-p", "attention_distance.sample=3", analyses="attention_distance"),
              "attention_distance has no parameter 'sample'; its parameters: seed, random_samples", status=2)


def test_param_wrong_type(photos, tmp_path):
    one_error(analyze(photos, tmp_path / "out", "-p", "attention_distance.random_samples=many",
                      analyses="attention_distance"), "random_samples", status=2)


def test_param_for_an_analysis_not_run(photos, tmp_path):
    one_error(analyze(photos, tmp_path / "out", "-p", "knn_probe.k=5"), "knn_probe is not among the analyses run",
              status=2)


def test_param_without_analysis_name(photos, tmp_path):
    one_error(analyze(photos, tmp_path / "out", "-p", "k=5"), "write ANALYSIS.PARAMETER=VALUE", status=2)


def test_analysis_unknown(photos, tmp_path):
    one_error(analyze(photos, tmp_path / "out", analyses="atention_stats"),
              "unknown analysis 'atention_stats'. Did you mean 'attention_stats'?", status=2)


def test_option_out_of_range(photos, tmp_path):
    result = analyze(photos, tmp_path / "out", "-b", "0")
    assert result.returncode == 2 and "Invalid value for '--batch-size'" in result.stderr
    assert "Traceback" not in result.stderr


def test_dtype_unknown(photos, tmp_path):
    one_error(analyze(photos, tmp_path / "out", "--dtype", "fp8"), "unknown dtype 'fp8'; use fp32, bf16 or fp16",
              status=2)


@pytest.mark.parametrize(("command", "needle"), [
    (("sae", "train", "-m", "tiny-vit", "--hook", "blocks.3.resid_post", "-d", "{photos}", "--kind", "foo"),
     "--kind must be one of relu, topk, batchtopk, matryoshka, got 'foo'"),
    (("sae", "train", "-m", "tiny-vit", "--hook", "blocks.3.resid_post", "-d", "{photos}", "--tokens-of", "foo"),
     "--tokens-of must be one of spatial, cls, registers, all, got 'foo'"),
    (("sae", "benchmark", "-M", "tiny-vit", "--kind", "foo"), "--kind must be one of relu, topk"),
    (("attribute", "{image}", "-m", "tiny-vit-sup", "--method", "foo"),
     "--method must be one of attention, rollout"),
    (("explain-pair", "-m", "tiny-vit-metric", "{image}", "{image}", "--projection", "foo"),
     "--projection must be one of auto, head, none, got 'foo'"),
    (("experiment", "robustness", "-M", "tiny-vit-sup", "-d", "{photos}", "--region", "foo"),
     "--region must be one of box, mask, got 'foo'"),
    (("synth", "-f", "foo"), "--format: unknown format 'foo'; choose one of imagefolder"),
])
def test_option_not_a_choice(command, needle, photos, tmp_path):
    """A value outside an option's choices is bad usage, refused before anything loads or is written."""
    fill = {"{photos}": str(photos), "{image}": str(photos / "good.png")}
    result = cli(*(fill.get(a, a) for a in command), "-o", str(tmp_path / "out"))
    one_error(result, needle, status=2)
    assert "fill" not in result.stderr  # the robustness message named a fill the user never gave
    assert not (tmp_path / "out").exists()


def test_option_missing_or_not_for_the_data(photos, tmp_path):
    from vitscope.data.synthetic.write import synthesize

    one_error(cli("featviz", "-m", "tiny-vit", "-o", str(tmp_path / "fv"), "--steps", "1"),
              "give at least one --unit (e.g. blocks.5.mlp.post:31) or --grid N", status=2)
    synthesize(tmp_path / "roxf", "revisitop", n=6, size=32, seed=0)
    one_error(cli("probe", "-m", "tiny-vit", "-d", f"{tmp_path / 'roxf'}::revisitop", "-o", str(tmp_path / "pr"),
                  "--limit", "5"), "--limit does not apply to revisitop", status=2)


@pytest.mark.parametrize("text", ["format: coco\n", "config_file: other.yaml\n", "imports: [my_module]\n"])
def test_config_unknown_key_of_a_runs_record_in_a_hand_written_file(photos, tmp_path, text):
    """The keys a run's record holds (results.json's config) were passed over in any file, silently."""
    one_error(_with_config(photos, tmp_path, text), "unknown key", status=2)


def test_config_record_names_plugin_code(tmp_path):
    """Someone else's results.json given to --config imported (ran) the files its record names, silently."""
    hostile = tmp_path / "hostile_record.py"
    ran = tmp_path / "it ran"
    hostile.write_text(f"open({str(ran)!r}, 'w').write('code ran')\n")
    data = str(folder_with_one_good_image(tmp_path))
    record = {"vitscope_version": "0.1.0", "command": "analyze",
              "config": {"model": "tiny-vit", "data": data, "analyses": ["attention_stats"], "limit": 2,
                         "imports": [{"analysis": "x", "module": "hostile_record", "file": str(hostile),
                                      "sha256": "0" * 64}]}}
    (tmp_path / "results.json").write_text(json.dumps(record))
    proc = cli("analyze", "--config", str(tmp_path / "results.json"), "-o", str(tmp_path / "o"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (f"error: the run recorded in {tmp_path / 'results.json'} used analyses from "
                                   f"{hostile}; a record does not run code: read it, then give it with --import "
                                   f"{hostile} (or import: in a config file)")
    assert not ran.exists() and not (tmp_path / "o").exists()


def test_config_record_names_plugin_code_to_import(tmp_path):
    """A record's config holding a hand-written file's ``import:`` key was imported too."""
    hostile = tmp_path / "hostile_import.py"
    ran = tmp_path / "it ran"
    hostile.write_text(f"open({str(ran)!r}, 'w').write('code ran')\n")
    record = {"vitscope_version": "0.1.0", "command": "analyze",
              "config": {"model": "tiny-vit", "data": str(folder_with_one_good_image(tmp_path)),
                         "analyses": ["attention_stats"], "import": [str(hostile)]}}
    (tmp_path / "results.json").write_text(json.dumps(record))
    one_error(cli("analyze", "--config", str(tmp_path / "results.json"), "-o", str(tmp_path / "o")),
              "names modules to import ('import'); a record does not run code", status=2)
    assert not ran.exists() and not (tmp_path / "o").exists()


@pytest.mark.usefixtures("clean_registry")
def test_config_record_names_plugin_code_given_by_another_name(tmp_path):
    """A record of a module imported by its dotted name, given again as its file's path, was refused."""
    import hashlib

    from helpers.plugin_lab import fenced
    from vitscope.analyses.plugins import import_analyses
    from vitscope.workflows.option_values import _require_imported

    module = tmp_path / "lab_by_path.py"
    module.write_text(fenced("python", "# my_lab/token_norm.py").replace('"token_norm"', '"token_norm_by_path"'))
    import_analyses(str(module))
    _require_imported("a_lab.lab_by_path", str(module), hashlib.sha256(module.read_bytes()).hexdigest(),
                      tmp_path / "results.json")  # no error: the same file



@pytest.mark.parametrize(("imports", "error"), [
    ([{"module": None, "file": 5}], "must be a run's record of its imports"),  # a traceback
    ([{"module": ["a"], "file": None}], "must be a run's record of its imports"),
    ([{"module": "json", "file": "/elsewhere/lab.py"}], "give it with --import /elsewhere/lab.py"),  # json: no plug-in
])
def test_config_record_names_plugin_code_wrongly(tmp_path, imports, error):
    record = {"vitscope_version": "0.1.0", "command": "analyze",
              "config": {"model": "tiny-vit", "data": str(folder_with_one_good_image(tmp_path)),
                         "analyses": ["attention_stats"], "imports": imports}}
    (tmp_path / "results.json").write_text(json.dumps(record))
    one_error(cli("analyze", "--config", str(tmp_path / "results.json"), "-o", str(tmp_path / "o")), error, status=2)
