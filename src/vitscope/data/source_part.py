"""Some positions of a Source as a Source of their own (a probe's training and test images, the first ``limit``
items): images, ground truth and labels come from the whole, by position."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

from vitscope.data.source import Source

__all__ = ["SourcePart"]


class SourcePart(Source):
    """``positions`` of ``source`` (in that order).

    Args:
        source: the whole.
        positions: positions in ``source``.
        name: what results.json calls this part (default ``<source name>[part]``).
    """

    def __init__(self, source: Source, positions: Sequence[int], name: str | None = None) -> None:
        super().__init__(strict=source.strict)
        self.source = source
        self.positions = np.asarray(positions, dtype=np.int64)
        self.name = name or f"{source.name}[part]"
        self.paths = [source.path(int(i)) for i in self.positions]
        self.class_names = getattr(source, "class_names", None)

    def load(self, i: int) -> Image.Image:
        return self.source.load(int(self.positions[i]))

    def targets(self, i: int) -> dict[str, Any]:
        return self.source.targets(int(self.positions[i]))

    def labels(self) -> np.ndarray:
        out = self.source.labels()[self.positions]
        if not len(out) or (out < 0).all():
            raise self._no_labels()
        return out

    def content_digest(self) -> str:
        """The whole's fingerprint and the positions: no image is decoded."""
        h = hashlib.sha256(self.source.fingerprint()["digest"].encode())
        h.update(self.positions.tobytes())
        return h.hexdigest()
