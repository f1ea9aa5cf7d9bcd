"""Fingerprints that key the feature cache: model weights, and any JSON-able settings.

A cache entry is reused only when every part of its key is unchanged (``FeatureCache`` docstring):
the model's weights and spec, the data (the source's own fingerprint, :mod:`vitscope.data.fingerprint`), the
view (preprocessing), the hook site and the pooling.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Mapping
from typing import Any

import torch

from vitscope.models.backbone import Backbone

__all__ = ["digest", "model_fingerprint", "tensors_digest"]

CACHE_FORMAT = 1  # bump when the layout or the meaning of cached arrays changes


def digest(obj: Any) -> str:
    """SHA-256 hex digest of a JSON-able object (keys sorted, so dict order does not matter)."""
    text = json.dumps(obj, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _hash_tensors(h: Any, tensors: Mapping[str, torch.Tensor]) -> None:
    for name, tensor in sorted(tensors.items()):
        t = tensor.detach().cpu().contiguous().reshape(-1)
        h.update(f"{name}|{t.dtype}|{tuple(tensor.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def tensors_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 hex digest of named tensors (names, dtypes, shapes and bytes; any device), e.g. a state dict."""
    h = hashlib.sha256()
    _hash_tensors(h, tensors)
    return h.hexdigest()


_MEMO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> (tensor versions, digest)


def _versions(backbone: Backbone) -> tuple:
    """Identity and in-place version counter of every tensor: unchanged tuple = unchanged weights."""
    return tuple((n, t.data_ptr(), t._version, t.device.type) for n, t in backbone.model.state_dict().items())


def model_fingerprint(backbone: Backbone) -> str:
    """Digest of the wrapped model's class, its ModelSpec and every parameter and buffer (names and bytes).

    Hashing reads each tensor once (about 1 GB/s); two models with equal weights and spec share a digest
    whatever their device and whatever ``spec.preprocessing`` says of where the settings came from. The digest
    is remembered per module until a tensor is replaced or modified in place (torch's version counters), so
    repeated extractions (one per DAVIS sequence) hash once.
    """
    versions = _versions(backbone)
    memo = _MEMO.get(backbone.model)
    if memo is not None and memo[0] == versions and memo[2] == backbone.spec:
        return memo[1]
    h = hashlib.sha256()
    h.update(type(backbone.model).__qualname__.encode())
    spec = {k: v for k, v in backbone.spec.to_dict().items() if k != "preprocessing"}  # a label, not a setting
    h.update(json.dumps(spec, sort_keys=True, default=str).encode())
    _hash_tensors(h, backbone.model.state_dict())
    _MEMO[backbone.model] = (versions, h.hexdigest(), backbone.spec)
    return h.hexdigest()
