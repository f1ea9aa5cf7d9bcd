"""What a run was made of: the identity of a model (stored in results.json); the data's fingerprint is
:func:`vitscope.data.fingerprint.data_fingerprint`."""

from __future__ import annotations

from typing import Any

from vitscope.data.fingerprint import data_fingerprint

__all__ = ["data_fingerprint", "model_identity"]


def model_identity(model_id: str, backbone: Any) -> dict[str, Any]:
    """What identifies a model in results.json: the id it was loaded by, its spec and a weights digest."""
    from vitscope.models.digest import model_fingerprint

    return {"id": model_id, **backbone.spec.to_dict(), "weights_sha256": model_fingerprint(backbone)[:16]}
