"""Bad featviz and attribute input ends in one line with the right exit status, before any work or output folder.

A non-finite weight and a unit the model lacks (a block, a channel, a token, a class) are bad usage (exit 2), found
before the optimisation and before ``--out`` is created; a loss that turns non-finite is one ``error:`` line
(exit 1), not a traceback.
"""

from __future__ import annotations

import math

import pytest
from PIL import Image

from helpers.cli import cli
from vitscope.errors import VitscopeError, VitscopeRuntimeError, VitscopeUsageError

TINY = ("-m", "tiny-vit-sup", "--image-size", "32", "--steps", "1")


def _featviz(out, *args: str):
    return cli("featviz", *TINY, "--out", str(out), *args)


def test_a_non_finite_lambda_tv_is_bad_usage_before_anything(tmp_path) -> None:
    run = _featviz(tmp_path / "fv", "--grid", "1", "--lambda-tv", "inf")
    assert run.returncode == 2, run.stderr
    assert "--lambda-tv must be a finite number" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "fv").exists()


@pytest.mark.parametrize("setting", [{"lr": math.inf}, {"lr": math.nan}, {"lr": 0.0}, {"lr": -0.1},
                                     {"lambda_tv": math.inf}, {"lambda_tv": math.nan}, {"lambda_tv": -1.0}])
def test_the_config_refuses_a_rate_or_weight_that_is_not_a_usable_number(setting) -> None:
    from vitscope.featviz.render import FeatvizConfig

    with pytest.raises(VitscopeUsageError, match="must be a finite number"):
        FeatvizConfig(**setting)


def test_a_diverged_optimisation_is_one_error_line(tmp_path) -> None:
    """A finite weight so large that the loss overflows at the first step."""
    import vitscope
    from vitscope.featviz.objectives import parse_objective
    from vitscope.featviz.render import FeatvizConfig, render

    with pytest.raises(VitscopeRuntimeError, match="diverged at step 0") as caught:
        render(vitscope.load_model("tiny-vit-sup", image_size=32), [parse_objective("blocks.0.mlp.post:1")],
               FeatvizConfig(steps=1, lambda_tv=1e300))
    assert isinstance(caught.value, FloatingPointError)  # still caught by an older `except FloatingPointError`
    run = _featviz(tmp_path / "fv", "-u", "blocks.0.mlp.post:1", "--lambda-tv", "1e300")
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert "error: feature visualisation diverged at step 0" in run.stderr


@pytest.mark.parametrize(("unit", "says"), [
    ("blocks.5.mlp.post:9999", "blocks.5.mlp.post:9999: channel 9999 is out of range; this site has 512 channels"),
    ("blocks.9.mlp.post:3", "unknown hook name 'blocks.9.mlp.post'"),
    ("blocks.5.mlp.post:3@999", "token 999 is outside the 16 spatial tokens of the 4x4 grid"),
    ("blocks.5.mlp.post:3@9,0", "token (9, 0) is outside the 4x4 grid"),
    ("logit:99", "logit:99: the head has 10 classes"),
    ("blocks.5.mlp.post", "cannot read unit 'blocks.5.mlp.post'"),
])
def test_a_unit_the_model_lacks_is_bad_usage_before_the_optimisation_and_out(tmp_path, unit, says) -> None:
    run = _featviz(tmp_path / "fv", "-u", unit)
    assert run.returncode == 2, run.stderr
    assert f"error: {says}" in run.stderr and "Traceback" not in run.stderr
    assert "optimising" not in run.stderr
    assert not (tmp_path / "fv").exists()


def test_a_grid_above_a_blocks_channels_is_capped_and_says_so(monkeypatch, tmp_path) -> None:
    from vitscope.featviz import workflow

    class Stop(Exception):
        pass

    def stop(backbone, objectives, cfg, chunk, log):
        raise Stop(len(objectives))

    monkeypatch.setattr(workflow, "_render_chunks", stop)  # what matters is said before the optimisation
    said: list[str] = []
    with pytest.raises(Stop) as caught:
        workflow.featviz_run(workflow.FeatvizOptions(model="tiny-vit-sup", out=tmp_path, grid=100000, steps=1,
                                                     image_size=32), log=said.append)
    assert caught.value.args == (6 * 512,)  # every channel of the 6 blocks, once
    assert "--grid 100000: capped at the channels of each block (3072 units in all)" in said, said


def test_an_attribution_target_the_head_lacks_is_bad_usage(tmp_path) -> None:
    image = tmp_path / "a.png"
    Image.new("RGB", (40, 40), (90, 20, 200)).save(image)
    run = cli("attribute", "-m", "tiny-vit-sup", str(image), "--out", str(tmp_path / "at"), "--method", "rollout",
              "--target", "99", "--image-size", "32")
    assert run.returncode == 2, run.stderr
    assert "error: target class 99 is out of range: tiny-vit-sup has 10 classes" in run.stderr
    assert "Traceback" not in run.stderr and not (tmp_path / "at").exists()  # before anything is written


def test_the_divergence_error_is_a_vitscope_error() -> None:
    from vitscope.featviz.render import FeatvizDivergedError

    assert issubclass(FeatvizDivergedError, VitscopeError) and issubclass(FeatvizDivergedError, FloatingPointError)
