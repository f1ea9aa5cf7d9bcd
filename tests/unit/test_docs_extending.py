"""The code of docs/extending.md runs as written: the analysis example and the family descriptor example."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitscope
from vitscope.analyses import registry as _registry
from vitscope.models import family as _family

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def snippet(first_line: str) -> str:
    """The fenced python block of the doc whose first line is ``first_line``."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    found = [b for b in blocks if b.splitlines()[0].strip() == first_line]
    assert len(found) == 1, f"docs/extending.md has {len(found)} blocks starting with {first_line!r}"
    return found[0]


@pytest.fixture
def clean_registries():
    analyses, groups, families = dict(_registry.ANALYSES), dict(_registry.GROUPS), dict(_family._FAMILIES)  # loaded
    yield
    for live, saved in ((_registry._ANALYSES, analyses), (_registry._GROUPS, groups), (_family._FAMILIES, families)):
        live.clear()
        live.update(saved)


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
