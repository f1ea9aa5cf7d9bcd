"""What a run was made of: the identity of a model (stored in results.json); the data's fingerprint is
:func:`vitscope.data.fingerprint.data_fingerprint`."""

from __future__ import annotations

from typing import Any

from vitscope.data.fingerprint import data_fingerprint

__all__ = ["attention_kernels", "data_fingerprint", "model_identity"]

#: how the attention patterns of timm-layout models (vitscope's tiny ones, timm's) are read
TIMM_PATTERNS = "recomputed from the recorded q and k (float32 softmax); the model's own kernel runs"


def _timm_kernel(model: Any) -> str | None:
    """``"sdpa"`` (timm's fused kernel), ``"eager"`` (its explicit path) or ``"mixed"`` from the blocks'
    ``fused_attn`` switches; None when the model has none."""
    switches = {m.fused_attn for m in model.modules() if isinstance(getattr(m, "fused_attn", None), bool)}
    if not switches:
        return None
    return "sdpa" if switches == {True} else "eager" if switches == {False} else "mixed"


def attention_kernels(backbone: Any) -> dict[str, str]:
    """The attention kernel a transformer runs (``attention_kernel``) and how its patterns are read
    (``pattern_kernel``): kernels round differently, so they are part of what made the numbers. Empty for CNNs."""
    if not backbone.spec.is_transformer:
        return {}
    inner = getattr(backbone, "inner", backbone)  # a tiled backbone runs the model it wraps
    config = getattr(getattr(inner, "base", inner.model), "config", None)
    if config is not None and hasattr(config, "_attn_implementation"):  # a Hugging Face model
        from vitscope.models.hf_attention import RECORDING_KERNEL, own_kernel

        return {"attention_kernel": own_kernel(config), "pattern_kernel": RECORDING_KERNEL}
    kernel = _timm_kernel(inner.model)
    return {} if kernel is None else {"attention_kernel": kernel, "pattern_kernel": TIMM_PATTERNS}


def model_identity(model_id: str, backbone: Any) -> dict[str, Any]:
    """What identifies a model in results.json: the id it was loaded by, its spec, a weights digest and its
    attention kernels (:func:`attention_kernels`)."""
    from vitscope.models.digest import model_fingerprint

    return {"id": model_id, **backbone.spec.to_dict(), "weights_sha256": model_fingerprint(backbone)[:16],
            **attention_kernels(backbone)}
