"""Experiments that change the computation itself (through the backbones' staged execution)."""

from vitscope.experiments.token_mixing import (
    TokenMixingCounts,
    TokenMixingResult,
    isolated_cls_logits,
    per_token_logits,
    token_mixing,
)

__all__ = ["TokenMixingCounts", "TokenMixingResult", "isolated_cls_logits", "per_token_logits", "token_mixing"]
