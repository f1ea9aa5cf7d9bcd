"""The code of docs/extending.md runs as written: the analysis example and the family descriptor example."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import vitscope
from helpers.doc_examples import registries_kept, snippet
from vitscope.models import family as _family


@pytest.fixture
def clean_registries():
    with registries_kept():
        yield


def test_the_analysis_example_runs_as_written(clean_registries) -> None:
    space: dict = {}
    exec(compile(snippet("# my_lab/token_norm.py"), "docs/extending.md (analysis)", "exec"), space)
    TokenNorm = space["TokenNorm"]
    assert vitscope.analyses.ANALYSES["token_norm"] is TokenNorm
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (48, 48, 3), dtype=np.uint8)) for _ in range(6)]
    usage = snippet("backbone = vitscope.load_model(\"tiny-vit\")").splitlines()
    run_lines = "\n".join(line for line in usage if "analyze(" not in line)  # the one writing to runs/ is not run
    space.update(images=images)
    exec(compile(run_lines, "docs/extending.md (usage)", "exec"), space)
    results, backbone = space["results"], space["backbone"]
    with torch.no_grad(), backbone.record("blocks.0.resid_post") as rec:
        backbone(backbone.preprocess(images))
    norms = rec["blocks.0.resid_post"].double().norm(dim=-1)
    assert float(results["token_norm"]["mean_norm"]) == pytest.approx(float(norms.mean()), rel=1e-9)
    assert TokenNorm(block=1).required_hooks(backbone.spec) == ["blocks.1.resid_post"]


def test_the_family_example_registers_a_family(clean_registries) -> None:
    space: dict = {}
    exec(compile(snippet("# src/vitscope/models/families/my_vit.py"), "docs/extending.md (family)", "exec"), space)
    family = _family.registered_families()["my_vit"]
    assert family is space["FAMILY"] and family.aliases[0].name == "my-vit-s16"
    assert family.prefix(type("Config", (), {"num_register_tokens": 2})()) == ("cls", "reg", "reg")
    assert "torch" in space, "the example's head calls torch.cat: the snippet must import torch"


def test_the_layout_example_is_aimv2s_layout() -> None:
    """The page's ``HFLayout`` example is the one AIMv2's descriptor uses (run as written)."""
    from vitscope.models.families import get_family

    space: dict = {}
    exec(compile(snippet("from vitscope.models.layout_names import HFLayout"), "docs/extending.md (layout)", "exec"),
         space)
    assert space["layout"] == get_family("aimv2").layout
