"""The command line refuses wrong options and paths before any work, in one ``error:`` line naming the option:
exit status 2 for a value wrong for the command (also when only the model shows it), 1 for other failures
(README, docs/errors.md). In this process: each command stops before a pass, so the file runs in seconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.cli import cli

IMAGE = "val2017/000000000001.jpg"


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    from vitscope.data.synthetic.write import synthesize

    return synthesize(tmp_path_factory.mktemp("world"), "coco", n=4, size=32)


@pytest.fixture
def afile(tmp_path) -> Path:
    path = tmp_path / "afile"
    path.write_bytes(b"")
    return path


def _refused(run, status: int, *words: str) -> str:
    """The one ``error:`` line of a refused command (lines before it: what it loaded), checked."""
    lines = run.stderr.strip().splitlines()
    assert run.returncode == status, run.stdout + run.stderr
    assert lines and lines[-1].startswith("error: ") and "Traceback" not in run.stderr, run.stderr
    assert "this is a bug" not in run.stderr
    for word in words:
        assert word in lines[-1], lines[-1]
    return lines[-1]


def test_an_empty_file_given_as_an_sae_is_one_line_naming_it(world, afile):
    run = cli("sae", "eval", "--sae", str(afile), "-m", "tiny-vit-sup", "-d", f"{world}::coco")
    _refused(run, 1, str(afile), "empty file")
    assert "tiny-vit-sup: input" not in run.stderr  # refused before the model loads


@pytest.mark.parametrize("where", ["file", "under-a-file"])
def test_sae_train_refuses_an_unusable_out_before_training(world, afile, where):
    out = afile if where == "file" else afile / "sae"
    run = cli("sae", "train", "-m", "tiny-vit-sup", "--hook", "blocks.3.resid_post", "-d", f"{world}::coco", "-o",
              str(out), "--latents", "64", "--k", "4", "--tokens", "500", "--batch-tokens", "128")
    _refused(run, 1, str(out), "give a folder" if where == "file" else "cannot create the output folder")
    assert "epoch" not in run.stderr and "input 64x64" not in run.stderr  # nothing loaded, nothing trained


@pytest.mark.parametrize("command", [
    ["synth", "-f", "coco", "--n", "2", "--size", "32", "-o", "{afile}"],
    ["zoo", "build", "tiny-vit-sup", "--steps", "1", "--dir", "{afile}"],
    ["demo", "--quick", "-o", "{afile}"],
])
def test_a_file_given_as_a_folder_to_write_is_refused_naming_the_option(afile, command):
    args = [a.format(afile=afile) for a in command]
    option = args[args.index(str(afile)) - 1]
    run = cli(*args)
    _refused(run, 1, f"{'--out' if option == '-o' else option} {afile} is a file; give a folder")
    assert "Errno" not in run.stderr and "generating" not in run.stderr


def test_probe_refuses_a_file_as_cache_and_missing_data_naming_the_option(world, afile, tmp_path):
    base = ["probe", "-m", "tiny-vit-metric", "-o", str(tmp_path / "p")]
    _refused(cli(*base, "-d", f"{world}::coco", "--cache", str(afile)), 1, f"--cache {afile} is a file")
    nowhere = tmp_path / "nowhere"
    line = _refused(cli(*base, "-d", str(nowhere)), 1, f"--data {nowhere} not found")
    assert "cannot tell the format" not in line
    _refused(cli(*base, "-d", f"{world}::coco", "--test-data", str(nowhere)), 1, f"--test-data {nowhere} not found")


def test_detecting_the_format_of_nothing_says_it_does_not_exist(tmp_path):
    from vitscope.data.formats.errors import DatasetFormatError
    from vitscope.data.load import detect_format

    with pytest.raises(DatasetFormatError, match="does not exist"):
        detect_format(tmp_path / "nowhere")


def test_featviz_refuses_options_that_need_data_before_optimising(tmp_path):
    base = ["featviz", "-m", "tiny-vit-sup", "-u", "blocks.5.mlp.post:3", "--steps", "2", "-o", str(tmp_path / "f")]
    for extra, named in ((["--token-mixing"], "--token-mixing needs --data"),
                         (["--spatial-information", "2"], "--spatial-information needs --data"),
                         (["--top-k", "3", "--limit", "2"], "--top-k and --limit need --data")):
        run = cli(*base, *extra)
        _refused(run, 2, named)
        assert "optimising" not in run.stderr


def test_featviz_summary_counts_one_unit_in_the_singular(tmp_path):
    run = cli("featviz", "-m", "tiny-vit-sup", "-u", "blocks.5.mlp.post:3", "--steps", "1", "-o", str(tmp_path / "f"))
    assert run.returncode == 0, run.stderr
    assert f"1 unit -> {tmp_path / 'f' / 'results.json'}" in run.stdout


def test_counted_nouns():
    from vitscope.cli.numbers import counted

    assert [counted(1, "analysis", "analyses"), counted(2, "analysis", "analyses"), counted(1, "image"),
            counted(0, "image")] == ["1 analysis", "2 analyses", "1 image", "0 images"]


def test_explain_pair_pooling_is_a_choice_in_command_line_words(world, tmp_path):
    base = ["explain-pair", str(world / IMAGE), str(world / "val2017/000000000002.jpg"), "-o", str(tmp_path / "p")]
    _refused(cli(*base, "-m", "tiny-vit-metric", "--pooling", "foo"), 2, "--pooling", "auto", "mean", "cls", "'foo'")
    line = _refused(cli(*base, "-m", "tiny-resnet-metric", "--pooling", "cls"), 2, "--pooling mean")
    assert "pooling='mean'" not in line


def test_explanations_unknown_method_is_bad_usage(world, tmp_path):
    _refused(cli("explanations", "-M", "tiny-vit-sup", "-d", f"{world}::coco", "-o", str(tmp_path / "e"),
                 "--methods", "rollout,foo"), 2, "--methods", "'foo'")


def test_the_explanations_benchmark_names_an_unknown_method_as_bad_usage():
    from vitscope.errors import VitscopeUsageError
    from vitscope.explain.benchmark import methods_for

    with pytest.raises(VitscopeUsageError, match="unknown attribution method 'foo'"):
        methods_for(None, ["foo"])  # type: ignore[arg-type]


def test_attribute_refuses_a_folder_and_target_with_like(world, tmp_path):
    out = str(tmp_path / "a")
    _refused(cli("attribute", "-m", "tiny-vit-sup", str(world), "-o", out), 1, f"{world} is a folder",
             "give image files")
    _refused(cli("attribute", "-m", "tiny-vit-sup", str(world / IMAGE), "--target", "3", "--like",
                 str(world / "val2017/000000000002.jpg"), "-o", out), 2, "--target and --like exclude each other")


def test_values_only_the_model_shows_wrong_are_bad_usage(world, tmp_path):
    _refused(cli("analyze", "-m", "tiny-vit-sup", "-d", f"{world}::coco", "-o", str(tmp_path / "a"), "-a",
                 "attention_stats", "--image-size", "60"), 2, "patch size 8")
    _refused(cli("compare", "-M", "tiny-vit-sup", "-d", f"{world}::coco", "-o", str(tmp_path / "c")), 2,
             "at least two models")


def test_sae_k_above_latents_is_bad_usage_naming_k(world, tmp_path):
    for command in (["sae", "train", "-m", "tiny-vit-sup", "--hook", "blocks.3.resid_post", "-d", f"{world}::coco",
                     "-o", str(tmp_path / "s")], ["sae", "benchmark", "-o", str(tmp_path / "b")]):
        line = _refused(cli(*command, "--latents", "64", "--k", "128"), 2, "--k 128", "--latents 64")
        assert "batch_tokens" not in line


@pytest.mark.parametrize("given", ["missing", "file"])
def test_zoo_list_refuses_a_dir_that_is_no_folder(afile, tmp_path, given):
    where = tmp_path / "nowhere" if given == "missing" else afile
    _refused(cli("zoo", "list", "--dir", str(where)), 2, f"--dir {where}")


@pytest.mark.parametrize("args", [["analyze", "-b", "0"], ["featviz", "-m", "x", "-o", "y", "--limit", "0"],
                                  ["probe", "--test-fraction", "1.5"], ["synth", "-o", "x"], ["--bogus"],
                                  ["zoo", "build", "--bogus"], ["sae", "train", "--k", "0"], ["nocommand"]])
def test_parser_errors_are_one_error_line_with_status_2(args):
    run = cli(*args)
    assert run.returncode == 2
    assert len(run.stderr.strip().splitlines()) == 1 and run.stderr.startswith("error: "), run.stderr
    assert "Usage:" not in run.stdout + run.stderr and "--help" in run.stderr


def test_help_still_works_and_a_bare_group_prints_its_help():
    assert cli("analyze", "--help").returncode == 0
    bare = cli("zoo")
    assert "Usage:" in bare.stdout + bare.stderr and "error:" not in bare.stderr


@pytest.mark.parametrize(("command", "option"), [(["artifacts"], "--batch-size"), (["featviz"], "--steps"),
                                                 (["featviz"], "--lambda-tv")])
def test_help_shows_a_default_once(command, option):
    text = " ".join(cli(*command, "--help").stdout.split())
    after = text[text.index(option):]
    entry = after[:after.index(" -", len(option) + 10)]  # up to the next option
    assert entry.count("default") == 1 and "[16]" not in entry and "[400]" not in entry, entry


@pytest.mark.parametrize(("command", "option"), [(["experiment", "guided-mae"], "--mask-ratio"),
                                                 (["experiment", "guided-mae"], "--seed"),
                                                 (["experiment", "robustness"], "--batch-size")])
def test_every_option_has_help(command, option):
    lines = cli(*command, "--help").stdout.splitlines()
    line = next(ln for ln in lines if option + " " in ln)
    assert not line.split(">", 1)[-1].strip().startswith("[default"), line


def test_a_folder_checked_without_keeping_it_is_not_left_behind(tmp_path):
    from vitscope.cli.paths import writable_folder

    writable_folder("--out", tmp_path / "a" / "b", keep=False)
    assert not (tmp_path / "a").exists()
