"""DAVIS 2017 semi-supervised video object segmentation: writer and lazy reader.

Layout (as the official release)::

    root/JPEGImages/480p/<seq>/00000.jpg ...
    root/Annotations/480p/<seq>/00000.png ...   indexed ("P") PNG: 0 = background, k = object k
    root/ImageSets/2017/{train,val}.txt         one sequence name per line

Annotation PNGs carry the official DAVIS palette, which is the PASCAL VOC colour map
(``[0,0,0], [128,0,0], [0,128,0], [128,128,0], [0,0,128], ...``). Readers must use the palette
*indices*, never the RGB colours. The writer does not resize: frames keep the synthetic resolution
even though the folder is called ``480p`` (the folder name is part of the layout, not a promise).
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from vitscope.atomic import atomic_path, write_text_atomic
from vitscope.data.formats.common import LazyDataset, save_jpeg
from vitscope.data.formats.errors import DatasetFormatError, safe_join
from vitscope.data.items import VideoSequence
from vitscope.data.synthetic.scene import Scene

__all__ = ["DavisDataset", "DavisSequence", "davis_palette", "palette_png", "read_davis_mask", "write_davis"]

_RESOLUTIONS = ("480p", "Full-Resolution")


def davis_palette(n: int = 256) -> np.ndarray:
    """The DAVIS / PASCAL VOC colour map by the standard bit-shifting algorithm.

    Returns:
        ``[n, 3]`` uint8; row k is the colour of object index k.
    """
    cmap = np.zeros((n, 3), dtype=np.uint8)
    for i in range(n):
        r = g = b = 0
        c = i
        for j in range(8):
            r |= ((c >> 0) & 1) << (7 - j)
            g |= ((c >> 1) & 1) << (7 - j)
            b |= ((c >> 2) & 1) << (7 - j)
            c >>= 3
        cmap[i] = (r, g, b)
    return cmap


def palette_png(index: np.ndarray, path: str | os.PathLike | io.BytesIO) -> None:
    """Save ``[H, W]`` uint8 object indices as an indexed PNG with the DAVIS palette (the official format of
    annotations and of results submitted to the evaluation)."""
    index = np.ascontiguousarray(index, dtype=np.uint8)
    png = Image.frombytes("P", (index.shape[1], index.shape[0]), index.tobytes())
    png.putpalette(davis_palette().reshape(-1).tolist())
    png.save(path, format="PNG")


def read_davis_mask(path: str | os.PathLike) -> np.ndarray:
    """Decode one annotation PNG to ``[H, W]`` uint8 object indices (palette indices, not colours).

    Raises:
        DatasetFormatError: the file is missing, unreadable, or not an indexed / grey-level PNG.
    """
    try:
        with Image.open(path) as img:
            if img.mode not in ("P", "L"):
                raise DatasetFormatError(
                    f"annotation {path} has mode {img.mode!r}; DAVIS masks must be indexed ('P') PNGs"
                )
            return np.asarray(img, dtype=np.uint8).copy()
    except DatasetFormatError:
        raise
    except (OSError, ValueError) as err:
        raise DatasetFormatError(f"cannot read annotation {path}: {err}") from err


class DavisSequence(VideoSequence):
    """A ``VideoSequence`` whose ``masks()`` checks the PNG mode and frame sizes."""

    def masks(self) -> np.ndarray:
        """``[T, H, W]`` uint8 object indices, decoded on demand.

        Raises:
            DatasetFormatError: a mask is unreadable, not indexed, or of another size than frame 0.
        """
        masks = [read_davis_mask(p) for p in self.mask_paths]
        for p, m in zip(self.mask_paths, masks):
            if m.shape != masks[0].shape:
                raise DatasetFormatError(
                    f"annotation {p} of sequence {self.name!r} is {m.shape}, frame 0 is {masks[0].shape}"
                )
        return np.stack(masks) if masks else np.zeros((0, 0, 0), dtype=np.uint8)


def _index_map(scene: Scene, order: dict[int, int], where: str) -> np.ndarray:
    """``[H, W]`` uint8 object indices of ``scene``; extends ``order`` (instance id -> index)."""
    h, w = scene.image.shape[:2]
    out = np.zeros((h, w), dtype=np.uint8)
    for obj in scene.objects:
        if obj.instance_id not in order:
            order[obj.instance_id] = len(order) + 1
        k = order[obj.instance_id]
        if k > 255:
            raise DatasetFormatError(f"{where} has more than 255 objects; DAVIS masks hold indices 1..255")
        mask = np.asarray(obj.mask, dtype=bool)
        if mask.shape != (h, w):
            raise DatasetFormatError(f"{where}: object mask {mask.shape} does not match image {(h, w)}")
        out[mask] = k  # later objects are drawn on top, as in the scene
    return out


def write_davis(
    videos: Sequence[Sequence[Scene]],
    root: str | os.PathLike,
    split: str = "val",
    names: Sequence[str] | None = None,
) -> Path:
    """Write synthetic videos in the DAVIS 2017 layout.

    Object index k of a video is the order of first appearance of its ``instance_id`` (1-based,
    counted over frames in order, objects in drawing order). ``ImageSets/2017/<split>.txt`` is
    (over)written with the names of these videos.

    Args:
        videos: each video is a list of ``Scene`` frames of one size.
        root: dataset root (created if needed).
        split: image-set name, e.g. ``"val"`` or ``"train"``.
        names: sequence names; default ``synth-<split>-000``, ...

    Returns:
        The root path.
    """
    root = Path(root)
    names = list(names) if names is not None else [f"synth-{split}-{i:03d}" for i in range(len(videos))]
    if len(names) != len(videos) or len(set(names)) != len(names):
        raise DatasetFormatError(f"need {len(videos)} distinct sequence names, got {names!r}")
    for name, frames in zip(names, videos):
        img_dir = safe_join(root / "JPEGImages" / "480p", name, "sequence names")
        ann_dir = safe_join(root / "Annotations" / "480p", name, "sequence names")
        img_dir.mkdir(parents=True, exist_ok=True)
        ann_dir.mkdir(parents=True, exist_ok=True)
        order: dict[int, int] = {}
        for t, scene in enumerate(frames):
            index = _index_map(scene, order, f"sequence {name!r} frame {t}")
            save_jpeg(np.asarray(scene.image, dtype=np.uint8), img_dir / f"{t:05d}.jpg")
            with atomic_path(ann_dir / f"{t:05d}.png") as tmp:
                palette_png(index, tmp)
    sets = root / "ImageSets" / "2017"
    sets.mkdir(parents=True, exist_ok=True)
    write_text_atomic(sets / f"{split}.txt", "".join(f"{n}\n" for n in names))
    return root


class DavisDataset(LazyDataset):
    """Lazy reader of a DAVIS 2017 split: a sequence of ``VideoSequence`` items (``DavisSequence``).

    Construction lists folders only (no image or mask is decoded) and checks that every sequence of
    the split has its frame and annotation folders with matching frame names. In test-dev and test-challenge
    only the first frame of a sequence is annotated: such a split loads with ``first_frame_only`` set and
    each sequence's ``mask_paths`` holding that one annotation.

    Args:
        root: dataset root.
        split: image-set name (``ImageSets/2017/<split>.txt``).
        resolution: ``"480p"`` or ``"Full-Resolution"``.

    Raises:
        DatasetFormatError: missing image-set file or folder, frame/mask counts that differ (other than one
            annotation of the first frame), or a split that mixes both kinds (the message names the sequence).
    """

    def __init__(self, root: str | os.PathLike, split: str = "val", resolution: str = "480p") -> None:
        self.root = Path(root)
        self.split = split
        self.resolution = resolution
        self.name = f"davis2017-{split}"
        if resolution not in _RESOLUTIONS:
            raise DatasetFormatError(f"unknown DAVIS resolution {resolution!r}; choose one of {_RESOLUTIONS}")
        #: the split's list of sequences
        self.set_file = self.root / "ImageSets" / "2017" / f"{split}.txt"
        if not self.set_file.is_file():
            raise DatasetFormatError(f"DAVIS image-set file {self.set_file} not found (is {self.root} a DAVIS 2017 "
                                     "root?)")
        seqs = [line.strip() for line in self.set_file.read_text().splitlines()]
        self.sequence_names = [s for s in seqs if s]
        self._items = [self._scan(s) for s in self.sequence_names]
        first_only = [s for s, (frames, masks) in zip(self.sequence_names, self._items) if len(masks) < len(frames)]
        if first_only and len(first_only) < len(self._items):
            full = next(s for s in self.sequence_names if s not in first_only)
            raise DatasetFormatError(f"split {split!r} mixes sequences annotated only on their first frame "
                                     f"({first_only[0]!r}) with fully annotated ones ({full!r}); give them as two "
                                     "splits")
        #: only the first frame of each sequence is annotated (DAVIS test-dev / test-challenge): masks can be
        #: propagated and written for the official evaluation, but not scored here
        self.first_frame_only = bool(first_only)

    def _scan(self, seq: str) -> tuple[list[str], list[str]]:
        where = f"{self.root / 'ImageSets' / '2017' / (self.split + '.txt')}"
        img_dir = safe_join(self.root / "JPEGImages" / self.resolution, seq, where)
        ann_dir = safe_join(self.root / "Annotations" / self.resolution, seq, where)
        for d in (img_dir, ann_dir):
            if not d.is_dir():
                raise DatasetFormatError(f"sequence {seq!r}: folder {d} not found")
        frames = sorted(p.name for p in img_dir.iterdir() if p.suffix.lower() in (".jpg", ".jpeg"))
        masks = sorted(p.name for p in ann_dir.iterdir() if p.suffix.lower() == ".png")
        if not frames:
            raise DatasetFormatError(f"sequence {seq!r}: no .jpg frames in {img_dir}")
        first_only = len(masks) == 1 and len(frames) > 1 and Path(masks[0]).stem == Path(frames[0]).stem
        if len(frames) != len(masks) and not first_only:
            raise DatasetFormatError(
                f"sequence {seq!r}: {len(frames)} frames in {img_dir} but {len(masks)} annotations in {ann_dir} "
                "(DAVIS annotates every frame, or only the first in test-dev and test-challenge)"
            )
        for f, m in zip(frames, masks):
            if Path(f).stem != Path(m).stem:
                raise DatasetFormatError(f"sequence {seq!r}: frame {f} has no annotation (found {m})")
        return [str(img_dir / f) for f in frames], [str(ann_dir / m) for m in masks]

    def __len__(self) -> int:
        return len(self._items)

    def _get(self, i: int) -> DavisSequence:
        frames, masks = self._items[i]
        return DavisSequence(name=self.sequence_names[i], frame_paths=list(frames), mask_paths=list(masks))

    def __repr__(self) -> str:
        return f"DavisDataset(root={str(self.root)!r}, split={self.split!r}, sequences={len(self)})"
