"""A metric-learning net's head projects its embedding: nothing that scores classes takes it for a classifier."""

from __future__ import annotations

import pytest
import torch

from vitscope.analyses.masking.foreground import ForegroundMasking
from vitscope.analyses.masking.frequency import FrequencyFiltering
from vitscope.errors import VitscopeValueError
from vitscope.models.outputs import output_change
from vitscope.models.spec import ModelSpec
from vitscope.zoo.store import load_zoo_model


@pytest.fixture(scope="module")
def metric():
    return load_zoo_model("tiny-vit-metric@step0")  # the seeded initial weights: no build needed


def test_the_zoo_marks_a_metric_head_as_an_embedding(metric) -> None:
    classifier = load_zoo_model("tiny-vit-sup@step0")
    assert metric.spec.has_head and metric.spec.head_output == "embedding" and not metric.spec.classifies
    assert metric.spec.to_dict()["head_output"] == "embedding"
    assert classifier.spec.classifies and "head_output" not in classifier.spec.to_dict()  # digests as before


@pytest.mark.parametrize("analysis", [ForegroundMasking(), FrequencyFiltering()])
def test_accuracy_analyses_refuse_a_metric_net(metric, analysis) -> None:
    reason = analysis.why_unsupported(metric.spec)
    assert reason is not None and "projects an embedding" in reason


def test_an_edit_of_a_metric_net_is_measured_by_cosine_not_class_kl(metric) -> None:
    clean = torch.randn(3, 128, generator=torch.Generator().manual_seed(0))
    assert set(output_change(metric, clean, clean)) == {"output_cosine"}
    assert output_change(metric, clean, clean)["output_cosine"] == pytest.approx(1.0)


def test_an_unknown_head_output_is_refused(metric) -> None:
    fields = {**metric.spec.__dict__, "head_output": "scores"}
    with pytest.raises(VitscopeValueError, match="head_output"):
        ModelSpec(**fields)
