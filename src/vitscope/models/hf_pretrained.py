"""``from_pretrained`` that loads what the checkpoint holds, quietly and the same way every time.

A ``ViTModel`` saved without its pooler (``add_pooling_layer=False``, or the backbone of a classifier) would
come back with a freshly, randomly initialised pooler: the weights digest in results.json would change between
identical runs, resume would refuse the saved state, and transformers would print a LOAD REPORT on every load. The
pooler is never used by vitscope (analyses read the tokens), so a pooler the checkpoint does not fill is
removed; any other weight the checkpoint lacks is reported in one warning, since it would be random. Weights the
checkpoint holds beyond what the model has room for (more blocks than config.json says) are refused, since the
model would silently be a truncated one; weights outside the loaded module (a text tower, other heads) are not.
transformers' own loading chatter (report tables, progress bars) stays out of vitscope's output.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Iterator
from typing import Any

from torch import nn

from vitscope.models.errors import ModelLoadError

__all__ = ["RandomWeightsWarning", "from_pretrained", "quiet_transformers"]


class RandomWeightsWarning(UserWarning):
    """The checkpoint lacks weights of the model it is loaded into: those are random and differ every load."""


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' logging at error level and its progress bars off, restored afterwards."""
    from transformers.utils import logging as tf_logging

    verbosity = tf_logging.get_verbosity()
    bars = tf_logging.is_progress_bar_enabled()
    tf_logging.set_verbosity_error()
    tf_logging.disable_progress_bar()
    try:
        yield
    finally:
        tf_logging.set_verbosity(verbosity)
        if bars:
            tf_logging.enable_progress_bar()


def _unfilled_pooler(model: nn.Module, missing: list[str]) -> list[str]:
    """The missing keys of a pooler that the checkpoint holds none of (empty when it holds some)."""
    pooler = getattr(model, "pooler", None)
    if not isinstance(pooler, nn.Module):
        return []
    names = {f"pooler.{k}" for k in pooler.state_dict()}
    found = [k for k in missing if k in names]
    return found if names and len(found) == len(names) else []


def _pattern(key: str) -> str:
    """``layers.#.mlp.fc1.weight`` for ``layers.11.mlp.fc1.weight``: a key with its indices left open."""
    return re.sub(r"(?<=\.)\d+(?=\.)|^\d+(?=\.)", "#", key)


def _block_of(key: str) -> str:
    """``layers.3`` for ``layers.3.mlp.fc1.weight``: the key up to its last index, the block it belongs to."""
    parts = key.split(".")
    last = max((i for i, part in enumerate(parts[:-1]) if part.isdigit()), default=len(parts) - 1)
    return ".".join(parts[:last + 1])


def _surplus_blocks(model: nn.Module, unexpected: list[str]) -> list[str]:
    """The blocks of the checkpoint that the model has no room for: unexpected keys shaped like the model's own
    (``layers.3.mlp.fc1.weight`` beside a model whose ``layers.#.mlp.fc1.weight`` stop at 1), as
    ``layers.3``. Keys of another module the checkpoint holds (a text tower, a decoder) look like none of the
    model's and are left alone."""
    own = {_pattern(k) for k in model.state_dict()}
    blocks = set()
    for key in unexpected:
        if _pattern(key) in own:
            blocks.add(_block_of(key))
    return sorted(blocks, key=lambda b: [int(t) if t.isdigit() else t for t in b.split(".")])


def _describe_blocks(blocks: list[str]) -> str:
    """``layers 2-3`` for ``layers.2`` and ``layers.3``; ``layers 2, 5`` when they are not consecutive."""
    groups: dict[str, list[int]] = {}
    for block in blocks:
        head, _, index = block.rpartition(".")
        if index.isdigit():
            groups.setdefault(head, []).append(int(index))
        else:
            groups.setdefault(block, [])
    parts = []
    for head, indices in groups.items():
        consecutive = len(indices) > 1 and indices == list(range(indices[0], indices[-1] + 1))
        shown = f"{indices[0]}-{indices[-1]}" if consecutive else ", ".join(map(str, indices))
        parts.append(f"{head} {shown}".strip())
    return "; ".join(parts)


def _refuse_surplus(model: nn.Module, source: str, unexpected: list[str]) -> None:
    blocks = _surplus_blocks(model, unexpected)
    if blocks:
        count = f"{len(blocks)} block{'s' if len(blocks) > 1 else ''}"
        raise ModelLoadError(f"the weights of '{source}' hold {count} more than its config.json says: "
                             f"{_describe_blocks(blocks)}; fix config.json (num_hidden_layers or the like) to match "
                             "the weights")


def _mismatched_shapes(cls: Any, source: str, kwargs: dict[str, Any]) -> str:
    """Which tensors have other shapes than the model (a second, tolerant load that lists them)."""
    with quiet_transformers(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, info = cls.from_pretrained(source, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs)
    found = list(info.get("mismatched_keys", []) or [])
    shown = "; ".join(f"{key} is {list(saved)} in the file, the model expects {list(wanted)}"
                      for key, saved, wanted in found[:2])
    return (shown + (f" and {len(found) - 2} more" if len(found) > 2 else "")) or "tensor shapes differ"


def from_pretrained(cls: Any, source: str, **kwargs: Any) -> nn.Module:
    """``cls.from_pretrained(source, **kwargs)`` without transformers' output; a pooler the checkpoint does not
    fill is removed (``model.pooler = None``); other missing weights raise a :class:`RandomWeightsWarning`.

    Raises:
        ModelLoadError: damaged weights, weights of other shapes than the model's, or weights of more blocks than
            the model has (its config.json says fewer than the file holds).
    """
    from safetensors import SafetensorError

    kwargs = {**kwargs, "trust_remote_code": False}  # never a checkpoint's own code
    try:
        with quiet_transformers():
            model, info = cls.from_pretrained(source, output_loading_info=True, **kwargs)
    except SafetensorError as err:
        raise ModelLoadError(f"the weights of '{source}' are damaged ({str(err).splitlines()[0]}); download or "
                             "save them again") from None
    except RuntimeError as err:
        if "mismatched" not in str(err):
            raise
        raise ModelLoadError(f"the weights of '{source}' do not fit the architecture its config.json describes: "
                             f"{_mismatched_shapes(cls, source, kwargs)}") from None
    _refuse_surplus(model, source, list(info.get("unexpected_keys", []) or []))
    missing = list(info.get("missing_keys", []) or [])
    pooler = _unfilled_pooler(model, missing)
    if pooler:
        model.pooler = None  # never read by vitscope; random weights would change the digest every load
    rest = sorted(k for k in missing if k not in pooler)
    if rest:
        shown = ", ".join(rest[:3]) + (f" and {len(rest) - 3} more" if len(rest) > 3 else "")
        warnings.warn(RandomWeightsWarning(
            f"{source}: {len(rest)} weight(s) of {type(model).__name__} are not in the checkpoint and were "
            f"initialised at random ({shown}); results that use them change from load to load"), stacklevel=2)
    return model
