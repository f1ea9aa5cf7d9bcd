"""Robust decoding of image files to 8-bit RGB (``load_rgb``) and file-backed datasets (``ImageFiles``)."""

from __future__ import annotations

import hashlib
import os
import stat
import threading
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

PathLike = str | os.PathLike

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff")

_ALPHA_MODES = frozenset({"RGBA", "RGBa", "LA", "La", "PA"})
_MAX_REASON_CHARS = 160


@dataclass
class ImageItem:
    """One loaded image: ``image`` is always 8-bit ``"RGB"``; ``targets`` holds ground truth, if any."""

    image: Image.Image
    path: str  # source path, or a pseudo-path such as "skimage:astronaut"
    index: int  # position in the dataset
    targets: dict = field(default_factory=dict)


@dataclass
class SkippedImage:
    """A file that could not be loaded; ``reason`` is one line, e.g. ``"truncated JPEG file"``."""

    path: str
    reason: str


class ImageLoadError(Exception):
    """A file could not be read as an image; the message is one line naming the file."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = str(path)
        self.reason = _one_line(reason)
        super().__init__(_one_line(f"cannot read {self.path}: {self.reason}"))

    def __reduce__(self):  # keep the exception picklable across worker processes
        return (type(self), (self.path, self.reason))


class EmptyDatasetError(ValueError):
    """No candidate image files were found; the message says where and which extensions count."""


class DatasetNotFoundError(EmptyDatasetError, FileNotFoundError):
    """The dataset source (folder, list file or image) does not exist."""


class SkippedImageWarning(UserWarning):
    """Warned once per unreadable file that a non-strict dataset skips."""


def _one_line(text: str) -> str:
    """Collapse ``text`` to a single line."""
    return " ".join(str(text).split())


def _short_reason(err: BaseException) -> str:
    """Return a short, single-line description of ``err``."""
    reason = _one_line(err) or type(err).__name__
    return reason if len(reason) <= _MAX_REASON_CHARS else reason[: _MAX_REASON_CHARS - 3] + "..."


_truncation_lock = threading.Lock()
_truncation_state = {"depth": 0, "saved": False}


@contextmanager
def _reject_truncated_images() -> Iterator[None]:
    """Force ``ImageFile.LOAD_TRUNCATED_IMAGES = False`` while decoding (restored afterwards).

    Another library may have switched it on, making Pillow pad truncated files with grey.
    The reference count keeps concurrent loads consistent.
    """
    with _truncation_lock:
        if _truncation_state["depth"] == 0:
            _truncation_state["saved"] = ImageFile.LOAD_TRUNCATED_IMAGES
        _truncation_state["depth"] += 1
        ImageFile.LOAD_TRUNCATED_IMAGES = False
    try:
        yield
    finally:
        with _truncation_lock:
            _truncation_state["depth"] -= 1
            if _truncation_state["depth"] == 0:
                ImageFile.LOAD_TRUNCATED_IMAGES = _truncation_state["saved"]


def _check_file(path: str) -> None:
    """Raise ``ImageLoadError`` if ``path`` is missing, not a regular file or empty."""
    try:
        info = os.stat(path)
    except OSError as err:
        reason = "file not found" if isinstance(err, FileNotFoundError) else _short_reason(err)
        raise ImageLoadError(path, reason) from None
    if stat.S_ISDIR(info.st_mode):
        raise ImageLoadError(path, "is a directory")
    if info.st_size == 0:
        raise ImageLoadError(path, "empty file")


def _apply_exif_orientation(img: Image.Image) -> Image.Image:
    """Rotate/flip ``img`` per its EXIF Orientation; malformed EXIF leaves it as stored."""
    try:
        return ImageOps.exif_transpose(img)
    except Exception:
        return img


def _scale_high_bit_depth(img: Image.Image) -> Image.Image:
    """Map a 16-bit, 32-bit integer or float single-channel image to 8-bit ``"L"``.

    ``I;16*`` uses the full 16-bit range (divide by 257, so 65535 -> 255). For ``"I"``
    and ``"F"`` the actual value range decides: [0, 1] floats scale by 255, [0, 255]
    is kept, [0, 65535] is treated as 16-bit, anything else is min-max normalised.
    """
    arr = np.nan_to_num(np.asarray(img).astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    lo, hi = (float(arr.min()), float(arr.max())) if arr.size else (0.0, 0.0)
    if img.mode.startswith("I;16") or (lo >= 0 and 255 < hi <= 65535):
        scaled = arr / 257.0
    elif lo >= 0 and hi <= 1 and img.mode == "F":
        scaled = arr * 255.0
    elif lo >= 0 and hi <= 255:
        scaled = arr
    else:
        scaled = (arr - lo) / (hi - lo) * 255.0 if hi > lo else np.zeros_like(arr)
    return Image.fromarray(np.clip(np.rint(scaled), 0, 255).astype(np.uint8))


def _composite_on_white(img: Image.Image) -> Image.Image:
    """Flatten an image with alpha onto white.

    Fully transparent pixels have undefined (often black or garbage) colour values that
    dropping alpha would expose; white is the conventional page/viewer backdrop.
    """
    rgba = img.convert("RGBA")
    background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(background, rgba).convert("RGB")


def _to_rgb8(img: Image.Image) -> Image.Image:
    """Convert a decoded image of any supported mode to 8-bit RGB."""
    if img.mode == "RGB":
        return img
    if img.mode.startswith("I") or img.mode == "F":
        return _scale_high_bit_depth(img).convert("RGB")
    if img.mode == "P" or img.mode in _ALPHA_MODES or "transparency" in img.info:
        return _composite_on_white(img)
    return img.convert("RGB")  # L, 1, CMYK, YCbCr, ...; unsupported modes raise ValueError


def load_rgb(path: PathLike) -> Image.Image:
    """Open, fully decode, EXIF-orient and convert an image file to 8-bit RGB.

    Args:
        path: Image file path.

    Returns:
        A new ``PIL.Image`` in mode ``"RGB"``, detached from the file.

    Raises:
        ImageLoadError: If the file is missing, empty, not an image, corrupt or truncated.
    """
    path_str = os.fspath(path)
    _check_file(path_str)
    fmt = "image"
    try:
        with _reject_truncated_images(), Image.open(path_str) as img:
            fmt = img.format or fmt
            img.load()
            out = _to_rgb8(_apply_exif_orientation(img))
            return out.copy() if out is img else out
    except UnidentifiedImageError:
        raise ImageLoadError(path_str, "cannot identify image file") from None
    except Image.DecompressionBombError:
        raise ImageLoadError(path_str, "image exceeds Pillow's decompression-bomb limit") from None
    except Exception as err:  # decoders raise OSError, SyntaxError, ValueError, ...
        if "truncated" in str(err).lower():
            raise ImageLoadError(path_str, f"truncated {fmt} file") from err
        raise ImageLoadError(path_str, _short_reason(err)) from err


class ImageDataset(ABC):
    """Shared behaviour of image datasets: indexing, skipping and strict mode.

    Subclasses set ``name`` and ``paths`` and implement ``_load`` and ``describe``.
    """

    name: str
    paths: list[str]

    def __init__(self, strict: bool = False) -> None:
        self.strict = strict
        self.skipped: list[SkippedImage] = []
        self._skipped_paths: set[str] = set()

    def __len__(self) -> int:
        return len(self.paths)

    @abstractmethod
    def _load(self, i: int) -> Image.Image:
        """Decode image ``i`` or raise ImageLoadError."""

    def get(self, i: int) -> ImageItem | None:
        """Load image ``i`` (negative indices count from the end).

        Returns:
            The item, or ``None`` if it is unreadable and not strict (then a
            ``SkippedImageWarning`` is issued and the file is added to ``skipped``).

        Raises:
            IndexError: If ``i`` is out of range.
            ImageLoadError: If the image is unreadable and ``strict`` is true.
        """
        n = len(self.paths)
        if not -n <= i < n:
            raise IndexError(f"image index {i} out of range for {n} images")
        i %= n
        try:
            image = self._load(i)
        except ImageLoadError as err:
            if self.strict:
                raise
            self._record_skip(self.paths[i], err)
            return None
        return ImageItem(image=image, path=self.paths[i], index=i, targets=self._targets(i))

    def _targets(self, i: int) -> dict:
        """Ground truth handed to analyses with image ``i`` (none for plain image files)."""
        return {}

    def _record_skip(self, path: str, err: ImageLoadError) -> None:
        """Warn about a skipped file and remember it (once per path)."""
        if path in self._skipped_paths:
            return
        self._skipped_paths.add(path)
        self.skipped.append(SkippedImage(path=path, reason=err.reason))
        warnings.warn(f"skipping image: {err}", SkippedImageWarning, stacklevel=3)

    def __iter__(self) -> Iterator[ImageItem]:
        """Yield every readable image in order (unreadable ones are skipped or raise)."""
        for i in range(len(self)):
            item = self.get(i)
            if item is not None:
                yield item


def _scan_folder(root: Path, extensions: tuple[str, ...]) -> list[str]:
    """Recursively list files under ``root`` whose suffix matches, sorted by relative path."""
    found = [p for p in root.rglob("*") if p.suffix.lower() in extensions and p.is_file()]
    found.sort(key=lambda p: p.relative_to(root).as_posix())
    return [str(p) for p in found]


def _read_list_file(list_file: Path) -> list[str]:
    """Read one path per line; skip blank and ``#`` lines; resolve relative to the file's folder."""
    entries = (line.strip() for line in list_file.read_text(encoding="utf-8").splitlines())
    paths = [Path(e).expanduser() for e in entries if e and not e.startswith("#")]
    return [os.path.normpath(p if p.is_absolute() else list_file.parent / p) for p in paths]


def _common_root(paths: Sequence[str]) -> Path | None:
    """Deepest folder containing every path, or ``None`` if there is none."""
    try:
        return Path(os.path.commonpath([os.path.abspath(os.path.dirname(p) or ".") for p in paths]))
    except ValueError:  # empty list, or paths on different drives
        return None


def _file_signature(path: str, root: Path | None) -> tuple[str, int, int]:
    """(relative path, size, mtime_ns) of ``path``; ``-1`` for size and mtime of missing files."""
    try:
        rel = Path(os.path.relpath(os.path.abspath(path), root)).as_posix() if root else path
    except ValueError:
        rel = path
    try:
        info = os.stat(path)
    except OSError:
        return (rel, -1, -1)
    return (rel, info.st_size, info.st_mtime_ns)


class ImageFiles(ImageDataset):
    """Images from a folder (recursive), a list of paths, or a text file listing one path per line."""

    def __init__(
        self,
        source: PathLike | Sequence[PathLike],
        strict: bool = False,
        extensions: Sequence[str] = IMAGE_EXTENSIONS,
    ) -> None:
        """Find the candidate files (images are decoded lazily by ``get``).

        Args:
            source: A folder (searched recursively, extensions matched case-insensitively,
                paths sorted), a ``.txt`` file listing paths (relative ones resolved against
                its folder; blank and ``#`` lines ignored), a single image file, or a
                list/tuple of paths.
            strict: Raise ``ImageLoadError`` on unreadable files instead of skipping them.
            extensions: Suffixes that count as images when scanning a folder.

        Raises:
            DatasetNotFoundError: If ``source`` does not exist (it is also an
                ``EmptyDatasetError`` and a ``FileNotFoundError``).
            EmptyDatasetError: If no candidate files are found.
        """
        super().__init__(strict=strict)
        self.extensions = tuple(e.lower() if e.startswith(".") else f".{e.lower()}" for e in extensions)
        if isinstance(source, (list, tuple)):
            self.paths = [os.fspath(p) for p in source]
            self.name, self.source = "files", f"list of {len(self.paths)} paths"
            self._root = _common_root(self.paths)
            where = "the given path list"
        else:
            where = self._init_from_path(Path(os.fspath(source)).expanduser())
        if not self.paths:
            raise EmptyDatasetError(_one_line(f"no images found in {where}"))

    def _init_from_path(self, src: Path) -> str:
        """Set ``paths``, ``name``, ``source`` and the fingerprint root; return a 'where' phrase."""
        if not src.exists():
            raise DatasetNotFoundError(_one_line(f"image source not found: {src}"))
        self.source = str(src)
        if src.is_dir():
            self.name, self._root = src.resolve().name or str(src), src
            self.paths = _scan_folder(src, self.extensions)
            return f"folder {src} (searched recursively for {', '.join(self.extensions)}, any case)"
        self.name, self._root = src.stem, src.parent
        if src.suffix.lower() == ".txt":
            self.paths = _read_list_file(src)
            return f"list file {src} (it has no path entries)"
        self.paths = [str(src)]
        return str(src)

    def _load(self, i: int) -> Image.Image:
        return load_rgb(self.paths[i])

    def describe(self) -> dict:
        """Summarise the dataset as ``{"name", "source", "num_files", "fingerprint"}``.

        The fingerprint is the first 16 hex chars of a SHA-256 over sorted (relative path,
        size, mtime_ns) tuples: it changes when files are added, removed or modified, and
        file contents are never hashed.
        """
        entries = sorted(_file_signature(p, self._root) for p in self.paths)
        digest = hashlib.sha256(repr(entries).encode("utf-8")).hexdigest()[:16]
        return {"name": self.name, "source": self.source, "num_files": len(self.paths), "fingerprint": digest}


def open_dataset(source: PathLike | Sequence[PathLike], strict: bool = False) -> ImageDataset:
    """Open ``"skimage"`` / ``"skimage:name1,name2"`` as ``SamplePhotos``, anything else as ``ImageFiles``.

    Args:
        source: Dataset spec or path(s); see ``ImageFiles``.
        strict: Raise on unreadable images instead of skipping them.
    """
    if isinstance(source, str) and "::" in source:  # "<root>::<format>", e.g. "data/coco::coco"
        from vitscope.data.annotated_source import AnnotatedSource
        from vitscope.data.load import load_dataset

        root, _, fmt = source.rpartition("::")
        return AnnotatedSource(load_dataset(root, fmt or None), strict=strict)
    if isinstance(source, str) and (source == "skimage" or source.startswith("skimage:")):
        from vitscope.data.sample_photos import SamplePhotos

        names = [n.strip() for n in source.partition(":")[2].split(",") if n.strip()]
        return SamplePhotos(names=names or None, strict=strict)
    return ImageFiles(source, strict=strict)
