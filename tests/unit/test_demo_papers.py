"""The default demo runs every paper 001 and 003 section at a size worth reading; --quick runs the same ones small."""

from __future__ import annotations

from vitscope.featviz.objectives import parse_objective
from vitscope.workflows.demo_papers import PAPER_SECTIONS, paper_settings


def test_the_default_demo_runs_every_paper_section_larger_than_quick():
    full, quick = paper_settings(quick=False), paper_settings(quick=True)
    assert PAPER_SECTIONS == ("featviz", "token_mixing", "interrelation", "interrelation_masking")
    blocks = sorted(parse_objective(u).site for u in full.units)
    assert len(full.units) >= 3 and blocks[0] == "blocks.0.mlp.post" and blocks[-1] == "blocks.5.mlp.post"
    assert set(quick.units) <= set(full.units) and quick.units
    assert full.steps >= 100 and 0 < quick.steps <= full.steps
    assert full.images == 200 and 0 < quick.images <= full.images
    assert len(full.ratios) == 10 and 0 < len(quick.ratios) <= len(full.ratios)
    assert full.to_dict()["model"] == "tiny-vit-sup" and full.to_dict()["units"] == full.units
