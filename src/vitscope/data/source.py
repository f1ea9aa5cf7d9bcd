"""``Source``: the one protocol every dataset follows, whatever it holds (files, a format, images in memory).

The engine reads a source by position: ``len(source)``, ``source.load(i)`` (an 8-bit RGB image, or an
:class:`~vitscope.data.images.ImageLoadError` naming the file), ``source.targets(i)`` (the ground truth it hands
to analyses: ``label``, ``masks``...), ``source.path(i)`` (what to call the image in outputs). Probes also ask
for ``labels()`` and ``regions(i)``; resume, the feature cache and results.json for ``fingerprint()``
(:func:`vitscope.data.fingerprint.data_fingerprint`, the one fingerprint function). Skipping unreadable images
is the reader's decision (the engine's ``strict``), not the source's; :meth:`Source.get` and iteration keep a
per-source list of skipped files for interactive use.
"""

from __future__ import annotations

import hashlib
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from vitscope.data.images import ImageItem, ImageLoadError, SkippedImage, SkippedImageWarning, full_size
from vitscope.errors import VitscopeValueError

__all__ = ["Source"]


def _check_mask_size(targets: dict[str, Any], image: Image.Image, path: str) -> None:
    """Ground-truth masks must cover the image pixel for pixel (an annotation file naming another size, or a
    mask of another file, would otherwise be stretched onto the image silently)."""
    masks = targets.get("masks")
    if masks is None or np.ndim(masks) != 3:
        return
    mask_hw, image_hw = tuple(np.shape(masks)[1:]), full_size(image)  # a drafted JPEG: the size it was decoded from
    if mask_hw != image_hw:
        raise ImageLoadError(path, f"its annotation masks are {mask_hw[1]}x{mask_hw[0]} but the image is "
                                   f"{image_hw[1]}x{image_hw[0]} (width x height)")


class Source(ABC):
    """A dataset the engine can read: images by position, their ground truth, their fingerprint.

    Subclasses set ``name`` and ``paths`` (a sequence of strings, one per image: file paths or names such as
    ``skimage:astronaut``) and implement :meth:`load`; they override :meth:`targets`, :meth:`fingerprint_files`
    and :meth:`describe` where they have more to say.

    Args:
        strict: :meth:`get` raises on an unreadable image instead of returning None.
    """

    name: str = "images"
    paths: Sequence[str]

    def __init__(self, strict: bool = False) -> None:
        self.strict = strict
        self.skipped: list[SkippedImage] = []  # what get() and iteration skipped (the engine keeps its own)
        self._skipped_paths: set[str] = set()

    # ------------------------------------------------------------ the protocol

    def __len__(self) -> int:
        return len(self.paths)

    def path(self, i: int) -> str:
        """What image ``i`` is called in outputs (its file path, or a name)."""
        return str(self.paths[i])

    @abstractmethod
    def load(self, i: int) -> Image.Image:
        """Image ``i`` as 8-bit RGB.

        Raises:
            ImageLoadError: unreadable (the message names the file).
        """

    def targets(self, i: int) -> dict[str, Any]:
        """Ground truth of image ``i`` handed to analyses (``batch.targets``): none for plain images."""
        return {}

    def target_keys(self) -> frozenset[str]:
        """The ground-truth keys this source provides, read from its first readable entry; ``label`` too when that
        entry is unlabelled but the source's own :meth:`labels` lists labels for others."""
        keys: frozenset[str] = frozenset()
        for i in range(min(len(self), 3)):
            try:
                keys = frozenset(self.targets(i))
                break
            except Exception:  # an unreadable entry: try the next one
                continue
        if "label" not in keys and self._lists_labels():
            keys |= {"label"}
        return keys

    def _lists_labels(self) -> bool:
        """Whether a subclass's own :meth:`labels` (which reads labels without images) finds any; the generic one
        is not asked, as it reads every entry's targets."""
        if type(self).labels is Source.labels:
            return False
        try:
            return bool((np.asarray(self.labels()) >= 0).any())
        except (ValueError, OSError):  # no labels, or a reader that cannot list them
            return False

    def labels(self) -> np.ndarray:
        """``[n]`` int64 image labels by position (-1 where unknown).

        Raises:
            ValueError: the source has no image labels.
        """
        out = np.full(len(self), -1, dtype=np.int64)
        for i in range(len(self)):
            label = self.targets(i).get("label")
            if label is not None:
                out[i] = int(label)
        if not len(out) or (out < 0).all():
            raise self._no_labels()
        return out

    def _no_labels(self) -> VitscopeValueError:
        advice = getattr(self, "label_advice", None)  # a reader's reason, e.g. a label column of plain ints
        return VitscopeValueError(f"{self.name}: this data has no image labels; "
                                  + (advice or "open a labelled dataset (--data ROOT::imagefolder, ::coco, "
                                     "::partimagenet...)"))

    def regions(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """``([M, H, W] bool, [M] int64)``: the region masks of image ``i`` and their labels.

        Raises:
            ValueError: the source has no region masks.
        """
        raise VitscopeValueError(f"{self.name}: this data has no region masks; object- and part-level features need a "
                                 "dataset with instance masks (--data ROOT::coco or ::partimagenet)")

    def fingerprint_files(self) -> tuple[Sequence[str], Path] | None:
        """``(files, root)`` whose stat signatures fingerprint this source, or None to hash its content."""
        return None

    def memory_digest(self) -> str | None:
        """SHA-256 of what defines this source's items in memory rather than in its files (labels given beside a
        path list, a ``datasets`` object's selection of its files' rows), hashed into the fingerprint; None when
        nothing does."""
        return None

    def content_digest(self) -> str:
        """SHA-256 of the decoded pixels of every image (sources without files; costs one decode each)."""
        h = hashlib.sha256()
        for i in range(len(self)):
            try:
                image = self.load(i)
            except ImageLoadError as err:
                h.update(f"unreadable:{err.reason}".encode())
                continue
            h.update(f"{image.mode}{image.size}".encode())
            h.update(image.tobytes())
        return h.hexdigest()

    def fingerprint(self) -> dict[str, Any]:
        """:func:`vitscope.data.fingerprint.data_fingerprint` of this source."""
        from vitscope.data.fingerprint import data_fingerprint

        return data_fingerprint(self)

    def describe(self) -> dict[str, Any]:
        """The data entry of results.json (the fingerprint is added by the writer)."""
        return {"name": self.name, "num_files": len(self)}

    # ------------------------------------------------------------ interactive use

    def first_images(self, n: int) -> list[Image.Image]:
        """The first ``n`` readable images (unreadable ones skipped as :meth:`get` skips them): a small fixed set to
        measure an edit's effect on."""
        kept: list[Image.Image] = []
        for i in range(len(self)):
            if len(kept) == n:
                break
            item = self.get(i)
            if item is not None:
                kept.append(item.image)
        return kept

    def get(self, i: int) -> ImageItem | None:
        """Image ``i`` with its ground truth (negative indices count from the end).

        Returns:
            The item, or None when it is unreadable and the source is not strict (a ``SkippedImageWarning`` is
            issued once and the file is added to ``skipped``).

        Raises:
            IndexError: ``i`` is out of range.
            ImageLoadError: unreadable under ``strict``.
        """
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"image index {i} out of range for {n} images")
        i %= n
        try:
            image, targets = self.load_checked(i)
        except ImageLoadError as err:
            if self.strict:
                raise
            self._note_skip(self.path(i), err)
            return None
        return ImageItem(image=image, path=self.path(i), index=i, targets=targets)

    def load_checked(self, i: int) -> tuple[Image.Image, dict[str, Any]]:
        """Image ``i`` (``0 <= i < len``) and its ground truth, whose masks must cover the image pixel for pixel.

        Raises:
            ImageLoadError: the file is unreadable, or its masks have another size than the image.
        """
        image = self.load(i)
        targets = dict(self.targets(i))
        _check_mask_size(targets, image, self.path(i))
        return image, targets

    def _note_skip(self, path: str, err: ImageLoadError) -> None:
        if path in self._skipped_paths:
            return
        self._skipped_paths.add(path)
        self.skipped.append(SkippedImage(path=path, reason=err.reason))
        warnings.warn(f"skipping image: {err}", SkippedImageWarning, stacklevel=3)

    def __iter__(self) -> Iterator[ImageItem]:
        """Every readable image in order (unreadable ones are skipped, or raise under ``strict``)."""
        for i in range(len(self)):
            item = self.get(i)
            if item is not None:
                yield item
