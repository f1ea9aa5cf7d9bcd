"""Canonical hook names: the vocabulary every adapter maps onto its own modules.

Transformer names and shapes (B batch, N tokens, D width, H heads, Dh head width):

=============================  ==================  =============================================
name                           shape               meaning
=============================  ==================  =============================================
``embed``                      ``[B, N, D]``       tokens entering block 0
``blocks.{i}.resid_pre``       ``[B, N, D]``       block input
``blocks.{i}.norm1``           ``[B, N, D]``       output of the pre-attention norm
``blocks.{i}.attn.q|k|v``      ``[B, H, N, Dh]``   queries / keys / values as they enter the kernel
``blocks.{i}.attn.pattern``    ``[B, H, N, N]``    post-softmax attention, float32, rows = queries
``blocks.{i}.attn.heads``      ``[B, H, N, Dh]``   every head's output (pattern times values) before the output
                                                   projection, which reads head h in columns h*Dh to (h+1)*Dh
``blocks.{i}.attn_out``        ``[B, N, D]``       attention branch added to the residual (after LayerScale)
``blocks.{i}.resid_mid``       ``[B, N, D]``       ``resid_pre + attn_out``
``blocks.{i}.norm2``           ``[B, N, D]``       output of the pre-MLP norm
``blocks.{i}.mlp.post``        ``[B, N, mlp_dim]`` MLP hidden activation after the non-linearity
``blocks.{i}.mlp_out``         ``[B, N, D]``       MLP branch added to the residual (after LayerScale)
``blocks.{i}.resid_post``      ``[B, N, D]``       block output
``final_norm``                 ``[B, N, D]``       final norm applied to every token
=============================  ==================  =============================================

Families whose blocks rotate queries and keys (DINOv3) also offer ``blocks.{i}.attn.q_unrotated`` and
``blocks.{i}.attn.k_unrotated`` ``[B, H, N, Dh]``: the projections before the rotation (``attn.q|k`` are the
rotated ones the kernel multiplies).

CNN names: ``stages.{i}`` ``[B, C, h, w]`` and ``features`` (last map before pooling).
"""

from __future__ import annotations

import difflib
import fnmatch

from vitscope.errors import VitscopeKeyError

BLOCK_SITES: tuple[str, ...] = (
    "resid_pre",
    "norm1",
    "attn.q",
    "attn.k",
    "attn.v",
    "attn.pattern",
    "attn.heads",
    "attn_out",
    "resid_mid",
    "norm2",
    "mlp.post",
    "mlp_out",
    "resid_post",
)
#: the sites inside the attention kernel (recording them routes the block through vitscope's kernel when needed)
ATTENTION_SITES: frozenset[str] = frozenset({"attn.q", "attn.k", "attn.v", "attn.pattern"})
#: every site of a block's attention that mixes tokens: the kernel's and the heads' output
ATTENTION_INTERNALS: frozenset[str] = ATTENTION_SITES | {"attn.heads"}


class UnknownHookError(VitscopeKeyError):
    """A requested hook name matches nothing the backbone offers."""

    def __str__(self) -> str:  # KeyError quotes its message; show it plainly
        return str(self.args[0])


def transformer_hook_names(num_blocks: int) -> list[str]:
    """Every canonical name of a transformer with ``num_blocks`` blocks, in execution order."""
    names = ["embed"]
    for i in range(num_blocks):
        names += [f"blocks.{i}.{site}" for site in BLOCK_SITES]
    names.append("final_norm")
    return names


def cnn_hook_names(num_stages: int) -> list[str]:
    """Every canonical name of a CNN with ``num_stages`` stages."""
    return ["embed"] + [f"stages.{i}" for i in range(num_stages)] + ["features"]


def split_block_name(name: str) -> tuple[int, str] | None:
    """``"blocks.3.attn.pattern"`` -> ``(3, "attn.pattern")``; None for non-block names."""
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blocks" and parts[1].isdigit():
        return int(parts[1]), parts[2]
    return None


def expand_names(requested: list[str] | tuple[str, ...] | str, valid: list[str], model: str = "model") -> list[str]:
    """Resolve exact names and glob patterns (``blocks.*.attn.pattern``) against ``valid``.

    Raises:
        UnknownHookError: a name or pattern matches nothing; the message lists close valid names.
    """
    if isinstance(requested, str):
        requested = [requested]
    valid_set = set(valid)
    out: list[str] = []
    for req in requested:
        if any(ch in req for ch in "*?["):
            matches = [v for v in valid if fnmatch.fnmatchcase(v, req)]
        else:
            matches = [req] if req in valid_set else []
        if not matches:
            raise UnknownHookError(_unknown_message(req, valid, model))
        out.extend(m for m in matches if m not in out)
    return out


def _unknown_message(req: str, valid: list[str], model: str) -> str:
    is_cnn = not any(v.startswith("blocks.") for v in valid)
    if is_cnn and ("attn" in req or req.startswith("blocks.")):
        return (f"{model} is a CNN and has no attention or blocks: '{req}' cannot be recorded; "
                "use stages.{i} or features")
    close = difflib.get_close_matches(req, valid, n=3, cutoff=0.5)
    hint = f" Closest: {', '.join(close)}." if close else ""
    if is_cnn:
        return f"unknown hook name '{req}' for {model}.{hint} Valid: embed, stages.{{i}}, features."
    num_blocks = sum(1 for v in valid if v.endswith(".resid_pre"))
    return (f"unknown hook name '{req}' for {model}.{hint} Valid: embed, final_norm, blocks.{{i}}.SITE with i in "
            f"0..{num_blocks - 1} and SITE one of {', '.join(BLOCK_SITES)}.")
