"""How a run decodes its images: in full (the default: published numbers), or JPEGs drafted at a reduced DCT scale
(``jpeg_draft``: faster on images far larger than the model's input, slightly different pixels), and what the run
records of that choice (the data entry of results.json, and the key of its state file)."""

from __future__ import annotations

import contextlib
from typing import Any

from vitscope.data.images import jpeg_drafting
from vitscope.errors import VitscopeValueError
from vitscope.models.backbone import Backbone
from vitscope.models.preprocess import resize_crop_geometry
from vitscope.models.views import StandardView

__all__ = ["DECODES", "data_entry", "decode_name", "decoding"]

#: what results.json's data entry says under "decode"
DECODES = ("full", "jpeg_draft")


def decode_name(jpeg_draft: bool) -> str:
    """The name a run records for its decoding."""
    return DECODES[1] if jpeg_draft else DECODES[0]


def data_entry(source: Any, jpeg_draft: bool = False) -> dict[str, Any]:
    """results.json ``data`` as every command writes it: the source's description, its fingerprint and how its
    images were decoded."""
    return {**source.describe(), "fingerprint": source.fingerprint(), "decode": decode_name(jpeg_draft)}


def decoding(backbone: Backbone, jpeg_draft: bool, view: Any = None) -> contextlib.AbstractContextManager:
    """The decoding of a pass: with ``jpeg_draft``, JPEGs drafted to the least scale that still covers the size the
    model's own resize gives (:func:`~vitscope.models.preprocess.resize_crop_geometry`).

    Raises:
        ValueError: ``jpeg_draft`` with inputs the model's own resize does not make (a view, or a backbone that
            preprocesses in its own way): the size to draft to would be unknown.
    """
    if not jpeg_draft:
        return contextlib.nullcontext()
    own = type(backbone).preprocess is not Backbone.preprocess
    if own or (view is not None and type(view) is not StandardView):
        raise VitscopeValueError("jpeg_draft needs the model's own resize and crop (no view, no preprocessing of the "
                                 "backbone's own): the size to decode JPEGs to would be unknown")
    spec = backbone.spec
    return jpeg_drafting(lambda hw: resize_crop_geometry(hw, spec)[0])
