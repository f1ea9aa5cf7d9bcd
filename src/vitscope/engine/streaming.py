"""What the engine does with each recorded tensor as the model makes it (docs/architecture.md, "Memory").

A batch's record would otherwise hold every block's tensors until the analyses' ``update``: at 1,370 tokens
(DINOv2-S at 518 px) one block's attention pattern for a batch of 16 is 720 MB, so every block's is 8.6 GB.
Instead, each hook an analysis streams (:meth:`~vitscope.analyses.base.Analysis.stream_hooks`) is handed to it
the moment the model makes it, every attention pattern is reduced to the run's shared block statistics at the
same moment, and the record keeps only the tensor's shape (a ``meta`` tensor) unless an analysis reads it
whole in ``update`` (:meth:`~vitscope.analyses.base.Analysis.record_reads`). One block's tensors are alive at
a time.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from vitscope.analyses.base import Analysis
from vitscope.analyses.batch import recorded_patterns
from vitscope.engine.memory import MemoryWarning, available_bytes, pattern_fit
from vitscope.hooks.names import expand_names, split_block_name
from vitscope.models.backbone import Backbone

__all__ = ["StreamPlan", "in_block_order", "stream_plan", "warn_if_patterns_do_not_fit"]


@dataclass(frozen=True)
class StreamPlan:
    """What happens to each recorded hook of a run as the model makes it.

    Attributes:
        streams: hook -> the analyses it is handed to (``update_hook``).
        reduced: hooks handled as they are made (the streamed ones and every attention pattern).
        kept: of those, the ones some analysis still reads whole in ``update`` (they stay in the record).
        patterns: attention pattern hook -> its block (its shared statistics are computed as it is made).
    """

    streams: dict[str, list[Analysis]]
    reduced: frozenset[str]
    kept: frozenset[str]
    patterns: dict[str, int]


def stream_plan(backbone: Backbone, analyses: Sequence[Analysis], hooks: Sequence[str]) -> StreamPlan:
    """What the engine does with each recorded hook of a run as the model makes it."""
    spec, valid = backbone.spec, list(hooks)
    streams: dict[str, list[Analysis]] = {}
    for a in analyses:
        wanted = a.stream_hooks(spec)
        for name in expand_names(wanted, valid, spec.name) if wanted else []:
            streams.setdefault(name, []).append(a)
    patterns = {key: block for block, key in recorded_patterns(dict.fromkeys(valid))}
    reduced = frozenset(streams) | frozenset(patterns)
    read = set()
    for a in analyses:
        wanted = a.record_reads(spec)
        read.update(expand_names(wanted, valid, spec.name) if wanted else [])
    return StreamPlan(streams, reduced, reduced & frozenset(read), patterns)


def warn_if_patterns_do_not_fit(backbone: Backbone, plan: StreamPlan, batch_size: int, device: torch.device
                                ) -> None:
    """Warn (:class:`~vitscope.engine.memory.MemoryWarning`) with the ``-b`` to use when a batch's attention
    patterns at the model's input size are unlikely to fit in the free memory."""
    if not plan.patterns:
        return
    spec = backbone.spec
    h, w = spec.grid_for(*spec.image_size)
    message = pattern_fit(spec.num_heads, spec.num_prefix_tokens + h * w, batch_size,
                          len(plan.kept & set(plan.patterns)), available_bytes(str(device)))
    if message:
        warnings.warn(message, MemoryWarning, stacklevel=3)


def in_block_order(record: Mapping[str, torch.Tensor]) -> list[str]:
    """The record's hook names, block by block (the order the model makes them; others first)."""
    def block(name: str) -> int:
        where = split_block_name(name)
        return -1 if where is None else where[0]
    return sorted(record, key=block)  # stable: the model's order within a block
