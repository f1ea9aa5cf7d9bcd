"""Feed any annotated dataset (COCO, ImageFolder, SOP...) to the engine, with its labels as targets."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from PIL import Image

from vitscope.data.formats.errors import DatasetFormatError
from vitscope.data.images import ImageDataset, ImageLoadError, load_rgb


class _LazyPaths(Sequence):
    """``paths[i]`` reads one entry's path on demand: million-entry datasets stay lazy."""

    def __init__(self, dataset: Any) -> None:
        self._ds = dataset

    def __len__(self) -> int:
        return len(self._ds)

    def __getitem__(self, i):  # type: ignore[override]
        try:
            return self._ds[i].image_path
        except DatasetFormatError as err:
            return f"<entry {i}: {err}>"


class AnnotatedSource(ImageDataset):
    """Images of a format reader's AnnotatedImage items; ``targets`` carries ``label``, ``instance_ids``, ``masks``.

    A missing file (the reader's DatasetFormatError) or an undecodable one is skipped with a
    warning, or stops the run under ``strict``, like plain image folders.
    """

    def __init__(self, dataset: Any, strict: bool = False) -> None:
        super().__init__(strict=strict)
        self.dataset = dataset
        self.name = getattr(dataset, "name", type(dataset).__name__)
        self.paths = _LazyPaths(dataset)  # type: ignore[assignment]

    def _load(self, i: int) -> Image.Image:
        try:
            item = self.dataset[i]
        except DatasetFormatError as err:
            raise ImageLoadError(f"entry {i}", str(err)) from None
        return load_rgb(item.image_path)

    def _targets(self, i: int) -> dict:
        item = self.dataset[i]
        out: dict = {}
        if getattr(item, "label", None) is not None:
            out["label"] = item.label
        if getattr(item, "instance_ids", None) is not None:
            out["instance_ids"] = item.instance_ids
        if getattr(item, "masks", None) is not None:  # [n, H, W] bool at the image's size (saliency_iou)
            out["masks"] = item.masks
        return out

    def describe(self) -> dict:
        return {"name": self.name, "source": str(getattr(self.dataset, "root", "")), "num_files": len(self),
                "format": type(self.dataset).__name__}
