"""A metric net stays one when saved and reloaded, and state saved before groups were counted still scores."""

from __future__ import annotations

import numpy as np
import torch

from vitscope.analyses.representation.hsic import MinibatchHSIC
from vitscope.explain.pair_report import default_projection
from vitscope.models.checkpoint import load_checkpoint, save_checkpoint
from vitscope.zoo.store import load_zoo_model


def test_a_metric_net_saved_as_a_checkpoint_reloads_with_its_embedding_head(tmp_path) -> None:
    folder = save_checkpoint(load_zoo_model("tiny-vit-metric@step0"), tmp_path / "ckpt")
    back = load_checkpoint(folder)
    assert back.spec.head_output == "embedding" and not back.spec.classifies
    assert default_projection(str(folder), back) == "head"  # explained as an embedding, whatever its name
    plain = load_checkpoint(save_checkpoint(load_zoo_model("tiny-vit-sup@step0"), tmp_path / "sup"))
    assert plain.spec.classifies


def test_a_cka_state_saved_without_its_group_count_pairs_equal_groups() -> None:
    gen = torch.Generator().manual_seed(0)
    xs, ys = [torch.randn(6, 5, generator=gen) for _ in range(2)], [torch.randn(6, 4, generator=gen) for _ in range(2)]
    state = MinibatchHSIC(batch=8, symmetric=False)
    state.add(np.arange(6), xs, ys)  # one open minibatch of 6 images
    want = state.cka()
    state.num_x = None  # as a state file written before the count was kept decodes
    torch.testing.assert_close(state.cka(), want)
