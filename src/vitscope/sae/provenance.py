"""What a sparse autoencoder and its measurement were made of, in the words of results.json: the model's identity (its
weights digest and preprocessing), the data's description with its fingerprint, where the passes ran, and the SAE's
own identity, so that an SAE folder and ``vitscope sae eval``'s record each say how to reproduce them."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vitscope._version import __version__
from vitscope.autoencoders.files import trained_on
from vitscope.autoencoders.model import SparseAutoencoder
from vitscope.data.source import Source
from vitscope.engine.provenance import model_identity
from vitscope.engine.settings import describe_device
from vitscope.models.backbone import Backbone
from vitscope.models.digest import tensors_digest

__all__ = ["data_spec", "sae_identity", "training_provenance"]


def data_spec(data: Any, source: Source) -> str:
    """The data as it was named (``world/::coco``, a folder), as results.json's ``config.data``; the source's name
    for data given as objects (a list of images), whose text would be the pixels."""
    return str(data) if isinstance(data, (str, os.PathLike)) else source.name


def training_provenance(backbone: Backbone, data: Mapping[str, Any], device: Any, processes: int,
                        record: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What cfg.json's ``"vitscope"`` entry says the SAE was trained on, beside its training settings.

    Args:
        backbone: the model read; its identity is recorded under its spec's name unless ``record`` gives
            ``models`` (the command line's, under the id the model was loaded by).
        data: :func:`~vitscope.engine.decoding.data_entry` of the whole data (every pass reads it in another order).
        device: where the passes ran; processes: how many shared them.
        record: more entries from the caller, e.g. ``environment`` (``vitscope.outputs.writer.environment``),
            replacing those of the same name.

    Returns:
        ``{"vitscope_version", "models": [identity], "data", "run": {"device", "processes"}, **record}``.
    """
    return {"vitscope_version": __version__, "models": [model_identity(backbone.spec.name, backbone)],
            "data": dict(data), "run": {"device": describe_device(device), "processes": int(processes)},
            **dict(record or {})}


def sae_identity(sae: SparseAutoencoder, path: str | Path) -> dict[str, Any]:
    """What identifies an SAE in a record of its measurement: where it was read, its shape, what it reads, a digest
    of its weights, and what its folder says it was trained on (``trained_on``: empty for other tools' files and
    folders written before vitscope recorded it)."""
    return {"path": str(path), "kind": sae.kind, "d_in": sae.d_in, "d_sae": sae.d_sae, "k": sae.k,
            "hook": getattr(sae, "hook", None), "model": getattr(sae, "model", None),
            "tokens_of": getattr(sae, "tokens_of", None),
            "weights_sha256": tensors_digest(sae.state_dict())[:16], "trained_on": trained_on(path)}
