"""Gradient and attention attributions of vision transformers and CNNs, exact under fused attention kernels:
:func:`attribute` (``vitscope.attribution.attribute(backbone, pixels, target, method)``)."""

from __future__ import annotations

from vitscope.attribution.attribute import attribute
from vitscope.attribution.methods import METHODS, TOKEN_METHODS

__all__ = ["METHODS", "TOKEN_METHODS", "attribute"]
