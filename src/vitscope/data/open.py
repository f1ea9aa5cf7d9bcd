"""``as_source``: whatever a user passes as data (a folder, ``ROOT::FORMAT``, a list of images, a reader...)
becomes a :class:`~vitscope.data.source.Source`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from PIL import Image

from vitscope.data.source import Source
from vitscope.errors import VitscopeTypeError

__all__ = ["as_source"]


def as_source(data: Any, strict: bool = False) -> Source:
    """A Source for ``data``.

    Args:
        data: a Source (returned as is); ``"ROOT::FORMAT"`` (a format reader; ``ROOT::`` detects the format;
            ``ROOT::hf[:SPLIT]`` a Hugging Face dataset on disk, ``'shards/{000000..000127}.tar::webdataset'``
            WebDataset shards); a ``datasets.Dataset`` / ``DatasetDict``;
            ``"skimage"`` / ``"skimage:name1,name2"`` (the bundled sample photos); a folder, a ``.txt`` list (of
            paths; of ``path label`` lines: read as ``::list``) or one image file; a list of paths; a list of PIL
            images or ``H x W x 3`` uint8 arrays; or a reader returned by :func:`vitscope.data.load_dataset`.
        strict: for sources opened here, :meth:`~vitscope.data.source.Source.get` raises on unreadable images.

    Raises:
        TypeError: ``data`` is none of these.
    """
    if isinstance(data, Source):
        return data
    from vitscope.data.hf_datasets import is_hf_dataset, open_hf

    if is_hf_dataset(data):  # a datasets.Dataset or DatasetDict object
        return open_hf(data, strict=strict)
    if isinstance(data, str) and "::" in data:  # "<root>::<format>[:<split>]", e.g. "coco::coco:val2014"
        from vitscope.data.annotated_source import AnnotatedSource
        from vitscope.data.load import load_dataset, parse_data

        root, fmt, options = parse_data(data)
        if fmt == "hf":  # Hugging Face datasets: images as bytes, not files
            return open_hf(root, options.get("split"), strict=strict)
        if fmt == "webdataset":  # tar shards, read in place
            from vitscope.data.webdataset import open_webdataset

            return open_webdataset(root, strict=strict)
        return AnnotatedSource(load_dataset(root, fmt, **options), strict=strict)
    if isinstance(data, str) and (data == "skimage" or data.startswith("skimage:")):
        from vitscope.data.sample_photos import SamplePhotos

        names = [n.strip() for n in data.partition(":")[2].split(",") if n.strip()]
        return SamplePhotos(names=names or None, strict=strict)
    if isinstance(data, (str, os.PathLike)):
        from vitscope.data.files import ImageFiles
        from vitscope.data.formats.path_list import is_labelled_list

        if str(data).lower().endswith(".txt") and is_labelled_list(data):  # "path label" lines: the list format
            from vitscope.data.annotated_source import AnnotatedSource
            from vitscope.data.load import load_dataset

            return AnnotatedSource(load_dataset(data, "list"), strict=strict)
        return ImageFiles(data, strict=strict)
    if isinstance(data, Sequence) and len(data) and all(isinstance(d, (str, os.PathLike)) for d in data):
        from vitscope.data.files import ImageFiles

        return ImageFiles(list(data), strict=strict)
    if isinstance(data, Sequence) and len(data) and not isinstance(data[0], (str, os.PathLike)) and (
            isinstance(data[0], Image.Image) or hasattr(data[0], "__array__")):
        from vitscope.data.memory import InMemoryImages

        return InMemoryImages(data)
    if hasattr(data, "__getitem__") and hasattr(data, "__len__"):  # a format reader
        from vitscope.data.annotated_source import AnnotatedSource

        return AnnotatedSource(data, strict=strict)
    raise VitscopeTypeError(f"cannot read images from a {type(data).__name__}; pass a folder, ROOT::FORMAT, a list of "
                            "paths or of images, a dataset from vitscope.data.load_dataset, or a vitscope.data.Source")

