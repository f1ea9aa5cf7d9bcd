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


_MEMO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> (versions, digest, spec, checksums)
_PROBES: dict[tuple[int, str], torch.Tensor] = {}  # (length, device) -> fixed weights of a checksum


def _versions(backbone: Backbone) -> tuple:
    """Name, identity, in-place version counter, dtype and shape of every tensor."""
    return tuple((n, t.data_ptr(), t._version, t.device.type, t.dtype, tuple(t.shape))
                 for n, t in backbone.model.state_dict().items())


def _probe(n: int, device: torch.device) -> torch.Tensor:
    key = (n, str(device))
    if key not in _PROBES:  # seeded by the length: the same weights in every process
        _PROBES[key] = (torch.rand(n, generator=torch.Generator().manual_seed(n)) + 0.5).to(device)
    return _PROBES[key]


@torch.no_grad()
def _checksums(backbone: Backbone) -> torch.Tensor:
    """Every tensor's rows ``[shape[0], -1]`` summed with fixed weights in [0.5, 1.5): ``[total rows]`` float32.

    One matrix-vector product per tensor on its own device (30-60 ms for a ViT-B on two CPU cores, against
    about 0.45 s for the SHA-256). A change beyond float32 rounding of a row's sum changes it (scaled weights, an
    EMA step, a copy of other weights, permuted rows or columns), also one made through ``.data``, which torch's
    version counters do not see.
    """
    sums = []
    for t in backbone.model.state_dict().values():
        if t.numel() == 0:
            continue
        t = torch.view_as_real(t) if t.is_complex() else t
        rows = t.reshape(t.shape[0], -1) if t.dim() >= 2 else t.reshape(1, -1)
        sums.append(torch.mv(rows.float(), _probe(rows.shape[1], rows.device)).cpu())
    return torch.cat(sums) if sums else torch.zeros(0)


def model_fingerprint(backbone: Backbone) -> str:
    """Digest of the wrapped model's class, its ModelSpec and every parameter and buffer (names and bytes).

    Hashing reads each tensor once (about 1 GB/s); two models with equal weights and spec share a digest
    whatever their device and whatever ``spec.preprocessing`` says of where the settings came from. The digest
    is remembered per module while no tensor is replaced and a checksum of every tensor's values is unchanged
    (torch's version counters miss weights changed through ``.data``, as EMA teachers are), so repeated
    extractions (one per DAVIS sequence) hash once.
    """
    versions = _versions(backbone)
    checksums = _checksums(backbone)
    memo = _MEMO.get(backbone.model)
    if memo is not None and memo[0] == versions and memo[2] == backbone.spec and torch.equal(memo[3], checksums):
        return memo[1]
    h = hashlib.sha256()
    h.update(type(backbone.model).__qualname__.encode())
    spec = {k: v for k, v in backbone.spec.to_dict().items() if k != "preprocessing"}  # a label, not a setting
    h.update(json.dumps(spec, sort_keys=True, default=str).encode())
    _hash_tensors(h, backbone.model.state_dict())
    _MEMO[backbone.model] = (versions, h.hexdigest(), backbone.spec, checksums)
    return h.hexdigest()
