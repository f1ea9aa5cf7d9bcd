"""Names and Analysis instances may be given together, as ``vitscope.run`` takes them."""

from __future__ import annotations

import pytest

import vitscope
from vitscope.analyses.attention.stats import AttentionStats
from vitscope.errors import VitscopeTypeError
from vitscope.workflows.analyze import choose_analyses


def test_named_analyses_come_first_then_the_instances_as_given() -> None:
    spec = vitscope.load_model("tiny-vit").spec
    mine = AttentionStats()
    chosen = choose_analyses(["attention_distance", mine], spec, frozenset())
    assert [a.name for a in chosen] == ["attention_distance", "attention_stats"] and chosen[1] is mine
    assert choose_analyses([mine], spec, frozenset()) == [mine]
    with pytest.raises(VitscopeTypeError, match="not int"):
        choose_analyses(["attention_distance", 3], spec, frozenset())
