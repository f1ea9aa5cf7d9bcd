"""Experiments that change the computation itself (through the backbones' staged execution)."""

from vitscope.experiments.token_mixing import (
    TokenMixing,
    TokenMixingResult,
    isolated_cls_logits,
    per_token_logits,
    token_mixing,
)

__all__ = ["TokenMixing", "TokenMixingResult", "isolated_cls_logits", "per_token_logits", "token_mixing"]
