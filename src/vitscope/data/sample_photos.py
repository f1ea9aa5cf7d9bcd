"""Sample photographs bundled with scikit-image, usable offline as a tiny dataset.

Only images shipped inside the scikit-image wheel are listed; ``skimage.data`` functions
that fetch files with ``pooch`` (``brain``, ``eagle``, ``kidney``, ``lily``, ``skin``, ...)
are excluded so the demo works without network access. Synthetic images (``binary_blobs``,
``checkerboard``, ``logo``, textures) are excluded because they are not photographs, and
``cat`` is an alias of ``chelsea``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import numpy as np
from PIL import Image

from vitscope.data.images import ImageLoadError
from vitscope.data.source import Source
from vitscope.errors import VitscopeValueError

SOURCE_PREFIX = "skimage"

SAMPLE_PHOTO_NAMES = (
    "astronaut",
    "chelsea",
    "coffee",
    "rocket",
    "motorcycle_left",
    "immunohistochemistry",
    "hubble_deep_field",
    "retina",
    "camera",
    "coins",
)


def _skimage_loader(name: str) -> Callable[[], np.ndarray]:
    """Return a zero-argument function producing the array for sample ``name``."""

    def load() -> np.ndarray:
        from skimage import data

        if name == "motorcycle_left":
            return data.stereo_motorcycle()[0]
        return getattr(data, name)()

    return load


def _array_to_rgb(arr: np.ndarray) -> Image.Image:
    """Convert a grayscale or RGB(A) uint8-compatible array to an 8-bit RGB image."""
    arr = np.asarray(arr)
    if arr.dtype != np.uint8:
        from skimage.util import img_as_ubyte

        arr = img_as_ubyte(arr)
    if arr.ndim == 3 and arr.shape[-1] == 4:
        arr = arr[..., :3]
    if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[-1] != 3):
        raise VitscopeValueError(f"unexpected array shape {arr.shape}")
    return Image.fromarray(np.ascontiguousarray(arr)).convert("RGB")


class SamplePhotos(Source):
    """The scikit-image sample photographs, with the same interface as ``ImageFiles``.

    Paths look like ``"skimage:astronaut"``; ``skipped`` stays empty unless a photo
    cannot be produced by the installed scikit-image.
    """

    def __init__(
        self,
        names: Sequence[str] | None = None,
        limit: int | None = None,
        strict: bool = False,
    ) -> None:
        """Select the photos.

        Args:
            names: Photo names from ``SAMPLE_PHOTO_NAMES``; all of them if ``None``.
            limit: Keep at most this many photos (after selecting ``names``).
            strict: Raise ``ImageLoadError`` if a photo cannot be loaded instead of skipping it.

        Raises:
            ValueError: If a name is unknown, the selection is empty or ``limit`` is negative.
        """
        super().__init__(strict=strict)
        chosen = list(SAMPLE_PHOTO_NAMES if names is None else names)
        unknown = [n for n in chosen if n not in SAMPLE_PHOTO_NAMES]
        if unknown:
            raise VitscopeValueError(
                f"unknown sample photo(s) {', '.join(unknown)}; choose from {', '.join(SAMPLE_PHOTO_NAMES)}"
            )
        if limit is not None:
            if limit < 0:
                raise VitscopeValueError(f"limit must be >= 0, got {limit}")
            chosen = chosen[:limit]
        if not chosen:
            raise VitscopeValueError("no sample photos selected")
        self.names = chosen
        self.name = SOURCE_PREFIX
        self.paths = [f"{SOURCE_PREFIX}:{n}" for n in chosen]

    def load(self, i: int) -> Image.Image:
        try:
            return _array_to_rgb(_skimage_loader(self.names[i])())
        except Exception as err:  # e.g. a future scikit-image that needs pooch for this photo
            first_line = (str(err).splitlines() or [type(err).__name__])[0]
            raise ImageLoadError(self.paths[i], first_line or type(err).__name__) from err

    def content_digest(self) -> str:
        """What defines the photos: the selected names and the scikit-image version (no decoding needed)."""
        import skimage

        return hashlib.sha256(repr((skimage.__version__, self.names)).encode("utf-8")).hexdigest()

    def describe(self) -> dict:
        """``{"name", "source", "num_files", "fingerprint"}``; the fingerprint hashes the selected names and the
        scikit-image version."""
        return {"name": self.name, "source": f"{SOURCE_PREFIX}:{','.join(self.names)}",
                "num_files": len(self.paths), "fingerprint": self.content_digest()[:16]}
