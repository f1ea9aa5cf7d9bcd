"""``from_pretrained`` that loads what the checkpoint holds, quietly and the same way every time.

A ``ViTModel`` saved without its pooler (``add_pooling_layer=False``, or the backbone of a classifier) would
come back with a freshly, randomly initialised pooler: the weights digest in results.json would change between
identical runs, resume would refuse the saved state, and transformers would print a LOAD REPORT on every load. The
pooler is never used by vitscope (analyses read the tokens), so a pooler the checkpoint does not fill is
removed; any other weight the checkpoint lacks is reported in one warning, since it would be random.
transformers' own loading chatter (report tables, progress bars) stays out of vitscope's output.
"""

from __future__ import annotations

import contextlib
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
    fill is removed (``model.pooler = None``); other missing weights raise a :class:`RandomWeightsWarning`."""
    from safetensors import SafetensorError

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
